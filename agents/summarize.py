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
from dataclasses import dataclass, field
from typing import Any

import orjson
from faust.types import Message, TableT

from agents.llm import LLMError
from agents.offline import offline_summary
from agents.prompting import cap_summary
from agents.summarizers import Summarizer
from schemas import (
    ActionsPayload,
    DeadLetter,
    SummarizeRequest,
    SummaryReady,
    decode,
    encode,
)
from streams import changelog, metrics
from streams.app import ContextApp
from streams.batch_source import BatchSource
from streams.dead_letters import DeadLetterWriter
from streams.lanes import InOrderAcks, Lanes, feed_lanes
from streams.tables import session_items, session_table
from streams.topics import MESSAGE_MAX_BYTES, Topics

__all__ = ["CARRY_MAX_BYTES", "SummaryState", "fold_large_carry", "register"]

log = logging.getLogger(__name__)

# The carried actions of failed requests go into the table entry (its changelog
# record must stay under MESSAGE_MAX_BYTES) and into the next prompt (which must
# fit a model's context): past this they are folded into the summary (see below).
CARRY_MAX_BYTES = MESSAGE_MAX_BYTES // 4


@dataclass
class SummaryState:
    generation: int
    summary: str | None = None
    covered_to: int = 0
    # Actions whose request failed after the retry budget: the next request
    # summarises them too, so the rolling summary never skips a range.
    carry: list[dict[str, Any]] = field(default_factory=list)
    carry_from: int | None = None
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


def fold_large_carry(state: SummaryState, max_chars: int, budget: int = CARRY_MAX_BYTES) -> bool:
    """If the carried actions exceed ``budget`` bytes, fold them into the rolling summary
    with the offline (extractive, no network) summarizer: the LLM has been failing, and
    a carry growing without bound would break the table entry, then every prompt.

    ``carry_from`` stays: the next summary emitted still starts its window there, so
    the summaries the sinks get stay contiguous. The summary stays bounded: half for
    what it held, half for the folded actions. Returns whether it folded.
    """
    if len(orjson.dumps(state.carry)) <= budget:
        return False
    carried = [ActionsPayload.model_validate(b) for b in state.carry]
    folded = cap_summary(offline_summary(None, carried), max_chars // 2)
    before = cap_summary(state.summary, max_chars // 2) if state.summary else ""
    state.summary = f"{before}\n(Summarised without the LLM:) {folded}".strip()
    state.carry = []
    return True


def _conversation_id(payloads: list[ActionsPayload]) -> str | None:
    return next((p.conversation_id for p in reversed(payloads) if p.conversation_id), None)


def register(app: ContextApp, topics: Topics, summarizer: Summarizer) -> TableT[str, bytes]:
    settings = app.settings
    table = session_table(app, "summaries")
    dead_letters = DeadLetterWriter(topics.dead_letters, stage="summarize")
    context_topic = topics.context.get_topic_name()

    def load(session_id: str, generation: int) -> SummaryState | None:
        """The state for this generation; ``None`` if the request is from an older one."""
        raw = changelog.read(table, session_id)
        state = SummaryState.from_bytes(raw) if raw is not None else None
        if state is None or state.generation < generation:
            return SummaryState(generation=generation)
        return state if state.generation == generation else None

    async def emit_summary(request: SummarizeRequest, state: SummaryState, text: str) -> None:
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
        )
        await (await app.append(context_topic, request.session_id.encode(), encode(op)))

    async def give_up(
        message: Message, request: SummarizeRequest, state: SummaryState, error: LLMError
    ) -> None:
        """Keep the raw context, record the failure, and carry the actions forward."""
        await dead_letters.write_letter(
            DeadLetter(
                reason=f"summarize failed after the retry budget: {error}",
                stage="summarize",
                source_topic=message.topic,
                partition=message.partition,
                offset=message.offset,
                key=request.session_id,
                original_b64=DeadLetter.encode_original(message.value),
                failed_at=time.time(),
            )
        )
        if state.carry_from is None:
            state.carry_from = request.seq_from
        state.carry.extend(b.model_dump(mode="json") for b in request.batches)
        metrics.SUMMARIES.labels("failed").inc()
        if fold_large_carry(state, settings.summary_max_chars):
            log.warning(
                "session %s: actions carried since %s passed %d bytes; folded into the "
                "summary by the offline summarizer",
                request.session_id,
                state.carry_from,
                CARRY_MAX_BYTES,
            )

    async def handle(session_id: str, item: tuple[Any, SummarizeRequest]) -> None:
        ticket, request = item
        state = load(session_id, request.generation)
        if state is None or request.seq_to <= state.covered_to:
            metrics.REPLAYS_SKIPPED.labels("summarize").inc()
            await acks.done(ticket)
            return
        payloads = [ActionsPayload.model_validate(b) for b in state.carry] + request.batches
        lanes.mark(session_id, "summarizing (LLM)")
        try:
            text = await summarizer.summarize(state.summary, payloads)
        except LLMError as exc:
            lanes.mark(session_id, "recording a failed summary")
            await give_up(ticket.message, request, state, exc)
        else:
            lanes.mark(session_id, "emitting its summary")
            await emit_summary(request, state, text)
            state.summary, state.covered_to = text, request.seq_to
            state.carry, state.carry_from = [], None
            metrics.SUMMARIES.labels("final" if request.final else "rolling").inc()
        state.updated_at = time.time()
        closed = request.final and not state.pending  # then its state expires
        value = None if closed else state.to_bytes()
        lanes.mark(session_id, "waiting for its changelog record")
        await changelog.confirm([(table, changelog.write(app, table, session_id, value))])
        await acks.done(ticket)  # only now, and in offset order, may Faust commit past it

    lanes: Lanes[tuple[Any, SummarizeRequest]] = Lanes(
        handle, max_pending=settings.max_in_flight_requests, on_error=app.crash_on_lane_error
    )
    app.manage_lanes(lanes, "summarize")
    # Lanes finish out of order; Faust must see acks in offset order (see InOrderAcks).
    acks = InOrderAcks()

    source = BatchSource(app, topics.summarize, max_buffered=settings.batch_buffer)

    @app.task
    async def summarize() -> None:
        await feed_lanes(
            source, lanes, acks, lambda raw: decode(SummarizeRequest, raw), dead_letters.write
        )

    @app.timer(max(settings.idle_timeout_s, 1.0), name="summarize.expire_idle")
    async def expire_idle_summaries() -> None:
        # A session that idled out with nothing pending never sends a final
        # request; its summary state goes after twice the idle time.
        horizon = time.time() - 2 * settings.idle_timeout_s

        def expired(raw: bytes | None) -> bool:
            state = None if raw is None else SummaryState.from_bytes(raw)
            return state is not None and state.updated_at < horizon and not state.pending

        current = await source.caught_up()
        candidates = [sid async for sid, raw in session_items(table, current) if expired(raw)]
        for sid in candidates:
            if expired(table.get(sid)):  # checked again: a request may have come since
                changelog.write(app, table, sid, None)

    return table
