"""Runs one sink as its own Faust agent over ``context``.

Per session, operations are applied strictly in order (one lane per session);
sessions proceed concurrently. Each operation is retried until the destination
takes it (a refused one is dead-lettered), and the session's context, with the
high-water marks that make redeliveries no-ops, is saved before the event is
acknowledged.
"""

from __future__ import annotations

import logging
import time

import faust
from faust.web import Request, Response, View
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    wait_exponential_jitter,
)

from schemas import InvalidMessage, context_operation_adapter
from sinks.base import ContextSink, Operation, PermanentSinkError
from sinks.context import SessionContext, Skip
from streams import metrics
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.lanes import Lanes
from streams.tables import session_table
from streams.topics import Topics

__all__ = ["register"]

log = logging.getLogger(__name__)

RETRY_MAX_WAIT_S = 30.0


def _decode(raw: bytes | None) -> Operation:
    if raw is None:
        raise InvalidMessage("empty message (no value)")
    try:
        return context_operation_adapter.validate_json(raw)
    except ValueError as exc:
        raise InvalidMessage(f"invalid context operation: {exc}") from None


def register(app: ContextApp, topics: Topics, sink: ContextSink) -> faust.Table:
    settings = app.settings
    contexts = session_table(app, "contexts")
    dead_letters = DeadLetterWriter(topics.dead_letters, stage=f"sink-{sink.name}")

    def load(session_id: str) -> SessionContext:
        raw = contexts.get(session_id)
        return SessionContext(session_id=session_id) if raw is None else SessionContext.from_bytes(raw)

    def log_retry(state: RetryCallState) -> None:
        metrics.SINK_RETRIES.labels(sink.name).inc()
        error = state.outcome.exception() if state.outcome else None
        log.warning(
            "sink %s: attempt %d failed (%s: %s); retrying in %.1fs",
            sink.name,
            state.attempt_number,
            type(error).__name__,
            error,
            state.next_action.sleep if state.next_action else 0.0,
        )

    async def deliver(op: Operation, context: SessionContext) -> None:
        """Retry until the destination takes it; order is kept because the lane waits."""
        async for attempt in AsyncRetrying(
            retry=retry_if_not_exception_type(PermanentSinkError),
            wait=wait_exponential_jitter(initial=0.2, max=RETRY_MAX_WAIT_S),
            before_sleep=log_retry,
            reraise=True,
        ):
            with attempt:
                await sink.apply(op, context)

    async def handle(session_id: str, item: tuple[faust.EventT, Operation]) -> None:
        event, op = item
        try:
            context = load(session_id).advanced(op)
        except Skip:
            metrics.REPLAYS_SKIPPED.labels(f"sink-{sink.name}").inc()
            await stream_ref[0].ack(event)
            return
        outcome = "applied"
        try:
            await deliver(op, context)
        except PermanentSinkError as exc:
            outcome = "refused"
            await dead_letters.write(event.message, f"{sink.name} refused {op.op}: {exc}")
        contexts[session_id] = context.to_bytes()
        metrics.SINK_OPERATIONS.labels(sink.name, op.op, outcome).inc()
        metrics.END_TO_END.labels(sink.name).observe(max(time.time() - op.emitted_at, 0.0))
        await stream_ref[0].ack(event)

    lanes: Lanes[tuple[faust.EventT, Operation]] = Lanes(
        handle, max_pending=settings.max_in_flight_requests
    )
    stream_ref: list[faust.StreamT[bytes]] = []

    @app.agent(topics.context, name=f"sink-{sink.name}")
    async def run_sink(stream: faust.StreamT[bytes]) -> None:
        manual = stream.noack()
        stream_ref[:] = [manual]
        async for event in manual.events():
            try:
                op = _decode(event.message.value)
            except InvalidMessage as exc:
                await dead_letters.write(event.message, exc.reason)
                await manual.ack(event)
                continue
            await lanes.submit(op.session_id, (event, op))

    @app.page("/sessions/{session_id}/context")
    @app.table_route(table=contexts, match_info="session_id")
    async def session_context(web: View, request: Request, session_id: str) -> Response:
        """The pull view: like the SDK's ContextStore, without summarised actions twice."""
        raw = contexts.get(session_id)
        if raw is None:
            return web.json({"error": f"no context for session {session_id!r}"}, status=404)
        context = SessionContext.from_bytes(raw)
        return web.json(
            {
                "session_id": session_id,
                "summary": context.summary,
                "summary_covers": [1, context.summary_to] if context.summary else None,
                "actions": [b.model_dump() for b in context.batches],
                "text": context.render(),
            }
        )

    return contexts
