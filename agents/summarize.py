"""The summarize agent: ``summarize`` requests -> rolling summaries -> ``context``.

Per session one LLM call at a time, in order; across sessions concurrently
(:class:`streams.lanes.Lanes`). Events are acknowledged by hand only after the
summary they produced is acknowledged by the broker, and Faust commits only the
contiguous acknowledged prefix, so a crash re-runs unfinished requests; the
table's high-water mark skips those already done.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import orjson
from faust.types import Message, TableT

from agents.costs import Accounting
from agents.llm import LLMError, llm_session, usage_of
from agents.offline import offline_summary
from agents.prompting import cap_summary
from agents.summarizers import Summarizer
from schemas import (
    ActionsPayload,
    SessionErased,
    SummarizeRequest,
    SummaryReady,
    decode,
    encode,
)
from streams._faust import changelog, stores
from streams._faust.batch_source import BatchSource
from streams._faust.commit import Write, commit
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter, from_message
from streams.lanes import InOrderAcks, Lanes, feed_lanes
from streams.observe import metrics
from streams.tables import session_items, session_table
from streams.topics import MESSAGE_MAX_BYTES, Topics

__all__ = ["CARRY_MAX_BYTES", "SummaryState", "fold_large_carry", "offline_fold", "register"]

log = logging.getLogger(__name__)

# The carried actions of failed requests go into the table entry (its changelog
# record must stay under MESSAGE_MAX_BYTES) and into the next prompt (which must
# fit a model's context): past this they are folded into the summary (see below).
CARRY_MAX_BYTES = MESSAGE_MAX_BYTES // 4


@dataclass
class SummaryState:
    """One session generation's rolling summary, from its first request to its close.

    Its lifetime follows the log, not a clock: it begins with the generation's
    first request and ends with its final request (the accumulator sends one
    for every session it closes, with or without batches). After the final it
    is kept as a small ``closed`` record, so a replay of that final (a crash
    before its offset was committed) is skipped instead of starting from
    nothing; only closed records expire (``summarize.forget_closed``).
    tests/test_fidelity.py proves it.
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

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively (no asdict deep copy)

    @classmethod
    def from_bytes(cls, raw: bytes) -> SummaryState:
        return cls(**orjson.loads(raw))

    @property
    def pending(self) -> bool:
        """Actions of failed requests that no emitted summary covers yet."""
        return self.carry_from is not None

    def replayed(self, request: SummarizeRequest) -> bool:
        """Taken before (a redelivery after a crash): skip it."""
        if self.closed:
            return True
        return not request.closes_only and request.seq_to <= self.requested_to

    def closed_record(self, now: float) -> SummaryState:
        return SummaryState(
            generation=self.generation,
            covered_to=self.covered_to,
            requested_to=self.requested_to,
            closed=True,
            updated_at=now,
        )


def offline_fold(
    previous: str | None, payloads: list[ActionsPayload], total: int, max_chars: int
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


def decode_request(raw: bytes | None) -> SummarizeRequest | SessionErased:
    if raw is not None and b'"session_erased"' in raw:
        return decode(SessionErased, raw)
    return decode(SummarizeRequest, raw)


def _conversation_id(payloads: list[ActionsPayload]) -> str | None:
    return next((p.conversation_id for p in reversed(payloads) if p.conversation_id), None)


def register(app: ContextApp, topics: Topics, summarizer: Summarizer) -> TableT[str, bytes]:
    settings = app.settings
    table = session_table(app, "summaries")
    accounting = Accounting(
        settings.llm_prices, settings.llm_daily_token_budget, settings.llm_product_budgets
    )
    dead_letters = DeadLetterWriter(topics.dead_letters, stage="summarize")
    context_topic = topics.context.get_topic_name()

    def load(session_id: str, generation: int) -> SummaryState | None:
        """The state for this generation; ``None`` if the request is from an older one."""
        raw = stores.read(table, session_id)
        state = SummaryState.from_bytes(raw) if raw is not None else None
        if state is None or state.generation < generation:
            return SummaryState(generation=generation)
        return state if state.generation == generation else None

    def check_chain(request: SummarizeRequest, state: SummaryState) -> None:
        """Each request starts right after the previous one of its generation, so each
        summary is prompted with its predecessor (or the carried actions)."""
        if request.seq_from == state.requested_to + 1:
            return
        metrics.SUMMARY_CHAIN_BREAKS.inc()
        log.warning(
            "session %s (generation %d): summary chain break: request for actions %d-%d, "
            "but the last one taken ended at %d; this summary starts without its predecessor",
            request.session_id,
            request.generation,
            request.seq_from,
            request.seq_to,
            state.requested_to,
        )

    async def emit_summary(
        request: SummarizeRequest, state: SummaryState, text: str
    ) -> Awaitable[Any]:
        """Produce the summary; the result resolves when the broker has it."""
        usage = accounting.record(request.product_id, usage_of(text))
        payloads = [ActionsPayload.model_validate(b) for b in state.carry] + request.batches
        op = SummaryReady(
            session_id=request.session_id,
            product_id=request.product_id,
            conversation_id=_conversation_id(payloads),
            generation=request.generation,
            seq_from=1,
            seq_to=request.seq_to,
            window_from=state.carry_from or request.seq_from,
            summary=text,
            final=request.final,
            emitted_at=time.time(),
            ledger=request.ledger,
            usage=usage,
        )
        return await app.append(context_topic, request.session_id.encode(), encode(op))

    async def give_up(
        message: Message, request: SummarizeRequest, state: SummaryState, error: LLMError
    ) -> None:
        """Keep the raw context, record the failure, and carry the actions forward."""
        await dead_letters.write_letter(
            from_message(
                message,
                f"summarize failed after the retry budget: {error}",
                "summarize",
                key=request.session_id,
            )
        )
        if state.carry_from is None:
            state.carry_from = request.seq_from
        state.carry.extend(b.model_dump(mode="json") for b in request.batches)
        metrics.SUMMARIES.labels("failed").inc()
        if fold_large_carry(state, settings.summary_max_chars, total=request.seq_to):
            log.warning(
                "session %s: actions carried since %s passed %d bytes; folded into the "
                "summary by the offline summarizer",
                request.session_id,
                state.carry_from,
                CARRY_MAX_BYTES,
            )

    async def summarise(
        message: Message, request: SummarizeRequest, state: SummaryState
    ) -> str | None:
        """The next summary of the session, or None when there is none to emit.

        A final request whose LLM call fails is summarised offline instead, so every
        generation ends with a summary that covers all of it (its raw notes go).
        """
        payloads = [ActionsPayload.model_validate(b) for b in state.carry] + request.batches
        if not payloads:  # a close right after a summary: that summary becomes the final
            return state.summary
        if accounting.over_budget(request.product_id):  # logged once a day per product
            return offline_fold(state.summary, payloads, request.seq_to, settings.summary_max_chars)
        lanes.mark(request.session_id, "summarizing (LLM)")
        llm_session.set(request.session_id)  # for the LLM's failure log lines
        try:
            return await summarizer.summarize(state.summary, payloads, total=request.seq_to)
        except LLMError as exc:
            if not request.final:
                lanes.mark(request.session_id, "recording a failed summary")
                await give_up(message, request, state, exc)
                return None
            log.warning(
                "session %s: final summary of actions %d-%d failed in the LLM (%s); "
                "summarised offline so the session closes with its whole history",
                request.session_id,
                state.carry_from or request.seq_from,
                request.seq_to,
                exc,
            )
            metrics.SUMMARIES.labels("offline_fallback").inc()
            return offline_fold(state.summary, payloads, request.seq_to, settings.summary_max_chars)

    async def handle(session_id: str, item: tuple[Any, SummarizeRequest | SessionErased]) -> None:
        ticket, request = item
        if isinstance(request, SessionErased):  # the summary state goes, whatever it held
            await commit(app, lambda: acks.done(ticket), writes=[(table, session_id, None)])
            return
        state = load(session_id, request.generation)
        if state is None or state.replayed(request):
            metrics.REPLAYS_SKIPPED.labels("summarize").inc()
            await acks.done(ticket)
            return
        check_chain(request, state)
        text = await summarise(ticket.message, request, state)
        outputs = []
        if text is not None:
            lanes.mark(session_id, "emitting its summary")
            outputs.append(await emit_summary(request, state, text))
            state.summary, state.covered_to = str(text), request.seq_to
            state.carry, state.carry_from = [], None
            metrics.SUMMARIES.labels("final" if request.final else "rolling").inc()
        state.requested_to = max(state.requested_to, request.seq_to)
        state.updated_at = time.time()
        if request.final:  # the generation is over: only a small closed record stays
            state = state.closed_record(state.updated_at)
        lanes.mark(session_id, "waiting for its summary and changelog record")
        # Only then, and in offset order, may Faust commit past the request.
        writes: list[Write] = [(table, session_id, state.to_bytes())]
        await commit(app, lambda: acks.done(ticket), outputs=outputs, writes=writes)

    lanes: Lanes[tuple[Any, SummarizeRequest | SessionErased]] = Lanes(
        handle, max_pending=settings.max_in_flight_requests, on_error=app.crash_on_lane_error
    )
    app.manage_lanes(lanes, "summarize")
    # Lanes finish out of order; Faust must see acks in offset order (see InOrderAcks).
    acks = InOrderAcks()

    source = BatchSource(app, topics.summarize, max_buffered=settings.batch_buffer)

    @app.task
    async def summarize() -> None:
        await feed_lanes(source, lanes, acks, decode_request, dead_letters.write)

    @app.timer(max(settings.idle_timeout_s, 1.0), name="summarize.forget_closed")
    async def forget_closed() -> None:
        # Only closed records go, and only on partitions read to their end: no
        # replay of their final request can still come (tests/test_fidelity.py).
        horizon = time.time() - settings.idle_timeout_s

        def expired(raw: bytes | None) -> bool:
            state = None if raw is None else SummaryState.from_bytes(raw)
            return state is not None and state.closed and state.updated_at < horizon

        current = await source.caught_up()
        candidates = [sid async for sid, raw in session_items(table, current) if expired(raw)]
        for sid in candidates:
            if expired(table.get(sid)):  # checked again: a request may have come since
                changelog.write(app, table, sid, None)

    return table
