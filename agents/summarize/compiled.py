"""A summarize request's actions read once, compiled (``native/src/request.rs``), where built.

The stage's default passes over a request's K actions were each a Python loop: the ledger's
count, the PII pass over the fields the default prompt reads, the prompt's lines (with the
request's decode, ~17% of the pipeline worker, docs/performance.md). :class:`RequestReader`
reads the request's bytes once for all three, without a Python object per action: its
ledger facts (merged by ``schemas.ledger.merge_facts``), the default prompt's actions and
the distinct texts they hold (``FormattedActions``), and the request's other fields: the
stage builds the request from them (``schemas.fast.request_of_read``) and decodes its
batches only where a Python pass needs them. Whatever it declines, and everything without
the extension (not built, or ``AC_COMPILED=false``), takes the Python passes, which give
the same ledger and prompt (tests/unit/test_compiled_request.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from agents.summarizer import FormattedActions
from schemas.ledger import LedgerLimits, RequestFacts
from streams.native import native as _native

__all__ = ["ReadRequest", "RequestReader"]


class ReadRequest(NamedTuple):
    facts: RequestFacts | None  # None: the stage counts the batches
    formatted: FormattedActions  # the default prompt's actions, for its batches alone
    conversation: str | None  # ``conversation_id(request.batches)``
    batches: int  # how many
    head: tuple[Any, ...]  # its other fields (``schemas.fast.request_of_read``)


class RequestReader:
    """``reader(raw)``: the request ``raw`` read for the stage's passes, or None."""

    def __init__(self, limits: LedgerLimits | None, *, enabled: bool = True) -> None:
        self.enabled = enabled and _native is not None
        if not self.enabled:
            return
        assert _native is not None
        limits = limits or LedgerLimits()  # no ledger: its facts are not asked for
        patterns = (limits.error_pattern, limits.key_pattern) if limits.default_patterns else ()
        self._spec = _native.RequestSpec(limits.errors, limits.key_actions, *patterns)
        self._read = _native.read_request

    def __call__(self, raw: bytes | None) -> ReadRequest | None:
        if not self.enabled or raw is None:
            return None
        read = self._read(raw, self._spec)
        if read is None:
            return None
        facts, actions, descriptions, urls, conversation, batches, head = read
        return ReadRequest(
            None if facts is None else RequestFacts(*facts),
            FormattedActions(actions, descriptions, urls, head[3]),
            conversation,
            batches,
            head,
        )
