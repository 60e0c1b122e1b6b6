"""A session generation's rolling-summary state and the offline fold (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from agents.summarize.compiled import RequestFacts, merge_facts
from agents.summarizer import cap_summary, offline_summary
from schemas import ActionsPayload, InvalidMessage, SessionErased, SummaryUsage, decode, fast
from schemas.fast import Request
from schemas.ledger import LedgerLimits, count_batches, new_ledger
from schemas.records import JsonRecord
from streams.topics import MESSAGE_MAX_BYTES

__all__ = [
    "CARRY_MAX_BYTES",
    "SummaryState",
    "conversation_id",
    "count_facts",
    "decode_request",
    "fold_large_carry",
    "offline_fold",
    "summary_operation",
]

# The carried actions of failed requests go into the table entry (its changelog
# record must stay under MESSAGE_MAX_BYTES) and into the next prompt (which must
# fit a model's context): past this they are folded into the summary (see below).
CARRY_MAX_BYTES = MESSAGE_MAX_BYTES // 4


@dataclass
class SummaryState(JsonRecord):
    """One session generation's rolling summary, from its first request to its close.

    Its lifetime follows the log, not a clock: it begins with the generation's
    first request and ends with its final request (the accumulator sends one
    for every session it closes, with or without batches). After the final it
    is kept as a small ``closed`` record, so a replay of that final (a crash
    before its offset was committed) is skipped instead of starting from
    nothing; only closed records expire (``summarize.forget_closed``).
    tests/integration/test_fidelity.py proves it.
    """

    generation: int
    summary: str | None = None
    covered_to: int = 0  # the summary covers actions 1..covered_to
    # The last seq_to of a request taken, summarised or carried: the next request
    # must start right after it (the chain check, ``ac_summary_chain_breaks_total``).
    requested_to: int = 0
    # Actions whose request failed after the retry budget: the next request
    # summarises them too, so the rolling summary never skips a range.
    carry: list[dict[str, Any]] = field(default_factory=list)
    carry_from: int | None = None
    closed: bool = False  # the generation's final request was handled
    updated_at: float = 0.0
    # The session's facts (schemas.ledger) up to ``requested_to``; None: turned off.
    ledger: dict[str, Any] | None = None

    @property
    def pending(self) -> bool:
        """Actions of failed requests that no emitted summary covers yet."""
        return self.carry_from is not None

    def replayed(self, request: Request) -> bool:
        """Taken before (a redelivery after a crash): skip it. A final with nothing new
        (``seq_from > seq_to``) is a replay only once the generation is closed."""
        if self.closed:
            return True
        return request.seq_from <= request.seq_to <= self.requested_to

    def closed_record(self, now: float) -> SummaryState:
        return SummaryState(
            generation=self.generation,
            covered_to=self.covered_to,
            requested_to=self.requested_to,
            closed=True,
            updated_at=now,
        )


def count_facts(
    state: SummaryState,
    request: Request,
    limits: LedgerLimits | None,
    facts: RequestFacts | None = None,
) -> None:
    """Count a request's actions into the session's ledger, once per request taken.

    Here, not in the accumulator: once per K actions from batches this stage decodes
    anyway, not re-encoded into every session entry (docs/decisions.md). A request
    from a worker before session 21 carries the facts so far itself: taken as they are.
    ``facts``: its batches' facts counted already (``agents.summarize.compiled``), merged
    where they can be.
    """
    if limits is None:
        return
    if request.ledger is not None:
        state.ledger = request.ledger
        return
    if state.ledger is None:
        state.ledger = new_ledger()
    if facts is not None and merge_facts(state.ledger, facts, limits):
        return
    # An action with no timestamps counts as forwarded (else as requested).
    batches = ((b.actions, b.forwarded_at or request.created_at) for b in request.batches)
    count_batches(state.ledger, batches, request.seq_from, limits)


def summary_operation(
    request: Request,
    state: SummaryState,
    text: str,
    *,
    conversation: str | None,
    usage: SummaryUsage | None,
    took_s: float,
    now: float,
) -> bytes:
    """The ``summary_ready`` operation for ``request``: the bytes ``encode(SummaryReady(...))``
    gives, written from values already valid (the ledger is the model's dump): 2.8 against
    30.8 µs a summary. tests/unit/test_summarize.py holds it to the model byte for byte."""
    return orjson.dumps(
        {
            "seq_from": 1,
            "seq_to": request.seq_to,
            "generation": request.generation,
            "op": "summary_ready",
            "session_id": request.session_id,
            "product_id": request.product_id,
            "conversation_id": conversation,
            "summary": str(text),
            "window_from": state.carry_from or request.seq_from,
            "final": request.final,
            "emitted_at": now,
            "ledger": state.ledger,
            "usage": None if usage is None else usage.model_dump(mode="json"),
            "summarized_in_s": round(took_s, 3),
        }
    )


def offline_fold(
    previous: str | None, payloads: Sequence[ActionsPayload], total: int, max_chars: int
) -> str:
    """Roll ``payloads`` into ``previous`` with the offline (extractive, no network)
    summarizer, for when the LLM cannot: half for what it held, half for the new."""
    folded = cap_summary(offline_summary(None, payloads, total=total), max_chars // 2)
    before = cap_summary(previous, max_chars // 2) if previous else ""
    return f"{before}\n(Summarised without the LLM:) {folded}".strip()


def fold_large_carry(
    state: SummaryState, max_chars: int, total: int, budget: int = CARRY_MAX_BYTES
) -> bool:
    """If the carried actions exceed ``budget`` bytes, fold them into the rolling summary
    with :func:`offline_fold`: the LLM has been failing, and a carry growing without
    bound would break the table entry, then every prompt.

    ``carry_from`` stays: the next summary emitted still starts its window there, so
    the summaries the sinks get stay contiguous. Returns whether it folded.
    """
    if len(orjson.dumps(state.carry)) <= budget:
        return False
    carried = [ActionsPayload.model_validate(b) for b in state.carry]
    state.summary = offline_fold(state.summary, carried, total, max_chars)
    state.carry = []
    return True


def decode_request(raw: bytes | None) -> Request | SessionErased:
    """A request, or an erasure; a refusal names the request's reason unless the message
    holds ``"session_erased"`` (an action's text may: tests/unit/test_summarize.py)."""
    try:
        return fast.decode_request(raw)
    except InvalidMessage:
        if raw is not None and b'"session_erased"' in raw:
            return decode(SessionErased, raw)
        raise


def conversation_id(payloads: list[ActionsPayload]) -> str | None:
    return next((p.conversation_id for p in reversed(payloads) if p.conversation_id), None)
