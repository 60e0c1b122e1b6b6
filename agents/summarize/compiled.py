"""A summarize request's actions read once, compiled (``native/src/request.rs``), where built.

The stage's default passes over a request's K actions were each a Python loop: the ledger's
count, the PII pass over the fields the default prompt reads, the prompt's lines (with the
request's decode, ~17% of the pipeline worker, docs/performance.md). :class:`RequestReader`
reads the request's bytes once for all three, without a Python object per action: its
ledger facts (merged by :func:`merge_facts`), the default prompt's actions and the distinct
texts they hold (``FormattedActions``), and the request's other fields: the stage builds the
request from them (:func:`request_of_read`) and decodes its batches only where a Python
pass needs them. Whatever it declines, and everything without
the extension (not built, or ``AC_COMPILED=false``), takes the Python passes, which give
the same ledger and prompt (tests/unit/test_compiled_request.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, overload

import msgspec

from agents.summarizer import FormattedActions
from schemas import fast
from schemas.fast import Request
from schemas.ledger import LedgerLimits
from streams.native import native as _native

__all__ = [
    "LazyBatches",
    "ReadRequest",
    "RequestFacts",
    "RequestReader",
    "merge_facts",
    "request_of_read",
]


class ReadRequest(NamedTuple):
    facts: RequestFacts | None  # None: the stage counts the batches
    formatted: FormattedActions  # the default prompt's actions, for its batches alone
    conversation: str | None  # ``conversation_id(request.batches)``
    batches: int  # how many
    head: tuple[Any, ...]  # its other fields (:func:`request_of_read`)


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


class RequestFacts(msgspec.Struct, frozen=True):
    """What ``schemas.ledger.count_batches`` counts from one summarize request's batches,
    counted from its bytes (``native/src/request.rs``: the default patterns, ASCII text),
    merged in O(pages) by :func:`merge_facts`. Its entries are the ledger's, ``{"seq", "text"}``."""

    keep: tuple[int, int]  # the limits' (errors, key_actions): the entries' bounds
    actions: int
    batches: int
    first_at: float
    last_at: float
    pages: list[tuple[str, int]]  # in the order each was first visited
    errors: list[dict[str, Any]]  # the latest ``keep[0]``
    errors_total: int
    key_actions: list[dict[str, Any]]
    key_actions_total: int
    first_step: dict[str, Any]
    last_step: dict[str, Any]


def merge_facts(ledger: dict[str, Any], facts: RequestFacts, limits: LedgerLimits) -> bool:
    """Merge a request's facts into ``ledger``: what ``count_batches`` makes of its
    batches, where no page has to make room (each counted on; new ones after the others).
    False, ``ledger`` untouched: the caller counts the batches (other bounds, a full page
    list). tests/unit/test_compiled_request.py holds it to ``count_batches`` on generated
    requests."""
    pages: dict[str, int] = ledger["pages"]
    if facts.keep != (limits.errors, limits.key_actions):
        return False
    if len(pages) + sum(page not in pages for page, _ in facts.pages) > limits.top_pages:
        return False
    for page, count in facts.pages:
        pages[page] = pages.get(page, 0) + count
    ledger["batches"] += facts.batches
    ledger["actions"] += facts.actions
    ledger["first_at"] = ledger["first_at"] or facts.first_at
    ledger["last_at"] = max(ledger["last_at"], facts.last_at)
    if ledger["first_step"] is None:
        ledger["first_step"] = facts.first_step
    ledger["errors_total"] += facts.errors_total
    ledger["key_actions_total"] += facts.key_actions_total
    for name, found, keep in (
        ("errors", facts.errors, limits.errors),
        ("key_actions", facts.key_actions, limits.key_actions),
    ):
        entries = ledger[name]
        entries += found
        del entries[: max(len(entries) - keep, 0)]  # the latest ``keep``, as count_batches
    ledger["last_step"] = facts.last_step
    return True


class LazyBatches(Sequence[Any]):
    """A request's batches, decoded (``schemas.fast.decode_request``) when first read: the
    compiled read serves the summarize stage's common path without them."""

    __slots__ = ("_count", "_decoded", "_raw")

    def __init__(self, raw: bytes, count: int) -> None:
        self._raw, self._count = raw, count
        self._decoded: list[Any] | None = None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Any: ...
    @overload
    def __getitem__(self, index: slice) -> list[Any]: ...
    def __getitem__(self, index: int | slice) -> Any:
        return self.decoded()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.decoded())

    def decoded(self) -> list[Any]:
        if self._decoded is None:
            self._decoded = fast.decode_request(self._raw).batches
        return self._decoded


def request_of_read(raw: bytes, head: tuple[Any, ...], batches: int) -> Request | None:
    """``schemas.fast.decode_request(raw)`` from the values a compiled read of ``raw`` gave
    (it takes what the strict Structs take, alike: tests/unit/test_compiled_request.py), its
    ``batches`` decoded when first read; None where the model would refuse it."""
    seq_from, seq_to, generation, session_id, product_id, final, created_at = head
    request = Request(
        seq_from=seq_from,
        seq_to=seq_to,
        generation=generation,
        session_id=session_id,
        product_id=product_id,
        batches=LazyBatches(raw, batches),
        final=final,
        created_at=created_at,
    )
    return request if fast.exact_request(request, batches) else None
