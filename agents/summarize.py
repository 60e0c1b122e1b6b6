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
from typing import Any, cast

import faust
import orjson
from faust.types import TableT

from agents.llm import LLMError
from agents.summarizers import Summarizer
from schemas import (
    ActionsPayload,
    DeadLetter,
    InvalidMessage,
    SummarizeRequest,
    SummaryReady,
    decode,
    encode,
)
from streams import metrics
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.lanes import InOrderAcks, Lanes
from streams.tables import owned_partitions, session_table
from streams.topics import Topics

__all__ = ["SummaryState", "register"]

log = logging.getLogger(__name__)


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


def _conversation_id(payloads: list[ActionsPayload]) -> str | None:
    return next((p.conversation_id for p in reversed(payloads) if p.conversation_id), None)


def register(app: ContextApp, topics: Topics, summarizer: Summarizer) -> TableT[str, bytes]:
    settings = app.settings
    table = session_table(app, "summaries")
    dead_letters = DeadLetterWriter(topics.dead_letters, stage="summarize")

    def load(session_id: str, generation: int) -> SummaryState | None:
        """The state for this generation; ``None`` if the request is from an older one."""
        raw = table.get(session_id)
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
        fut = await topics.context.send(key=request.session_id, value=encode(op))
        await fut

    async def give_up(
        event: faust.EventT, request: SummarizeRequest, state: SummaryState, error: LLMError
    ) -> None:
        """Keep the raw context, record the failure, and carry the actions forward."""
        message = event.message
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

    async def handle(session_id: str, item: tuple[Any, SummarizeRequest]) -> None:
        ticket, request = item
        event = ticket.event
        state = load(session_id, request.generation)
        if state is None or request.seq_to <= state.covered_to:
            metrics.REPLAYS_SKIPPED.labels("summarize").inc()
            await acks.done(ticket)
            return
        payloads = [ActionsPayload.model_validate(b) for b in state.carry] + request.batches
        try:
            text = await summarizer.summarize(state.summary, payloads)
        except LLMError as exc:
            await give_up(event, request, state, exc)
        else:
            await emit_summary(request, state, text)
            state.summary, state.covered_to = text, request.seq_to
            state.carry, state.carry_from = [], None
            metrics.SUMMARIES.labels("final" if request.final else "rolling").inc()
        state.updated_at = time.time()
        if request.final and not state.carry:
            table.pop(session_id, None)  # the session is closed: expire its state
        else:
            table[session_id] = state.to_bytes()
        await acks.done(ticket)  # only now, and in offset order, may Faust commit past it

    lanes: Lanes[tuple[Any, SummarizeRequest]] = Lanes(
        handle, max_pending=settings.max_in_flight_requests
    )
    # Lanes finish out of order; Faust must see acks in offset order (see InOrderAcks).
    acks = InOrderAcks()

    @app.agent(topics.summarize, name="summarize")
    async def summarize(stream: faust.StreamT[bytes]) -> None:
        manual = cast(faust.Stream[bytes], stream).noack()
        async for event in manual.events():
            ticket = acks.track(manual, event)
            try:
                request = decode(SummarizeRequest, event.message.value)
            except InvalidMessage as exc:
                await dead_letters.write(event.message, exc.reason)
                await acks.done(ticket)
                continue
            await lanes.submit(request.session_id, (ticket, request))

    @app.timer(max(settings.idle_timeout_s, 1.0), name="summarize.expire_idle")
    async def expire_idle_summaries() -> None:
        # A session that idled out with nothing pending never sends a final
        # request; its summary state goes after twice the idle time.
        horizon = time.time() - 2 * settings.idle_timeout_s
        owned = owned_partitions(app, topics.summarize)
        for sid, raw in list(table.items()):
            if table.partition_for_key(sid) not in owned:
                continue  # stale: another worker owns it now (see owned_partitions)
            state = SummaryState.from_bytes(raw)
            if state.updated_at < horizon and not state.carry:
                table.pop(sid, None)

    return table
