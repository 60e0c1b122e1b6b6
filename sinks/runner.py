"""Runs one sink as its own Faust agent over ``context``.

Per session, operations are applied strictly in order (one lane per session);
sessions proceed concurrently. Each operation is retried until the destination
takes it (a refused one is dead-lettered), and the session's context, with the
high-water marks that make redeliveries no-ops, is saved before the event is
acknowledged.

Dead letters of this sink come back on its own re-drive topic
(``redrive.sink-<name>``, fed by ``agent-context dead-letters redrive``), into
the same lanes: a refused operation is applied again once, other sinks never
see it twice.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from faust.types import Message, TableT
from faust.web import Request, Response, View
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_not_exception_type,
    wait_exponential_jitter,
)

from schemas import (
    ActionsWritten,
    InvalidMessage,
    SessionErased,
    SessionLink,
    context_message_adapter,
    decode,
)
from sinks.base import (
    ContextSink,
    LinkAwareSink,
    Operation,
    PermanentSinkError,
    erase_at_destination,
    start_sink,
    stop_sink,
)
from sinks.context import REFUSED_KEPT, SessionContext, Skip, refused_key
from sinks.context_store import ContextStore
from streams._faust.batch_source import BatchSource
from streams._faust.commit import Write, commit
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.lanes import InOrderAcks, Lanes, feed_lanes
from streams.observe import metrics
from streams.observe.web import unauthorized
from streams.tables import session_keyed_table
from streams.topics import Topics, declare_topic, redrive_topic

__all__ = ["pull_view", "register"]

log = logging.getLogger(__name__)

FIRST_RETRY_DELAY_S = 0.2
RETRY_MAX_WAIT_S = 30.0


@dataclass(frozen=True)
class Redriven:
    """A dead letter of this sink sent back (the original operation or link)."""

    item: Operation | SessionErased | SessionLink

    @property
    def session_id(self) -> str:
        return self.item.session_id


# (an ``InOrderAcks`` ticket for the event, the decoded message)
LaneItem = tuple[Any, "Operation | SessionErased | SessionLink | Redriven"]


def _decode_redriven(raw: bytes | None) -> Redriven:
    """A context operation, or a link: what this sink's dead letters hold."""
    try:
        return Redriven(_decode(raw))
    except InvalidMessage:
        return Redriven(decode(SessionLink, raw))


def _decode(raw: bytes | None) -> Operation | SessionErased:
    if raw is None:
        raise InvalidMessage("empty message (no value)")
    try:
        # orjson then validation: 17% less CPU than pydantic's own JSON parsing
        # (``validate_json``), which was an eighth of a sink's CPU at 5,000 actions/s.
        return context_message_adapter.validate_python(orjson.loads(raw))
    except ValueError as exc:  # orjson.JSONDecodeError and ValidationError both are
        raise InvalidMessage(f"invalid context operation: {exc}") from None


def pull_view(context: SessionContext) -> dict[str, Any]:
    """What ``GET /sessions/{id}/context`` answers: the context an agent reads, as text
    and as structured JSON (the summary, its facts, the raw batches after it)."""
    previous = context.previous
    return {
        "session_id": context.session_id,
        "generation": context.generation,
        "summary": context.summary,
        "summary_covers": [1, context.summary_to] if context.summary else None,
        "summaries": context.summaries,
        "actions_applied": context.actions_to,
        "closed": context.closed,
        "ledger": context.ledger.model_dump() if context.ledger else None,
        "actions": [b.model_dump() for b in context.batches],
        "previous": None
        if previous is None
        else {
            "generation": previous.generation,
            "summary": previous.summary,
            "summary_covers": [1, previous.summary_to] if previous.summary else None,
            "actions_applied": previous.actions_to,
            "closed": previous.closed,
            "ledger": previous.ledger.model_dump() if previous.ledger else None,
            "actions": [b.model_dump() for b in previous.batches],
        },
        "text": context.render(),
    }


def register(app: ContextApp, topics: Topics, sink: ContextSink) -> TableT[str, bytes]:
    settings = app.settings
    # Headers and batches of a session on one changelog partition: see ContextStore.save.
    contexts = session_keyed_table(app, "contexts")
    dead_letters = DeadLetterWriter(topics.dead_letters, stage=f"sink-{sink.name}")

    store = ContextStore(app, contexts)
    # Bound once: ``labels()`` per operation was 3% of a sink's CPU (py-spy).
    end_to_end = metrics.END_TO_END.labels(sink.name)
    action_age = metrics.ACTION_AGE_AT_SINK.labels(sink.name)
    event_age = metrics.ACTION_EVENT_AGE_AT_SINK.labels(sink.name)
    operations_counted: dict[tuple[str, str], Any] = {}

    def count_operation(op: str, outcome: str) -> None:
        if (counter := operations_counted.get((op, outcome))) is None:
            counter = operations_counted[(op, outcome)] = metrics.SINK_OPERATIONS.labels(
                sink.name, op, outcome
            )
        counter.inc()

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

    async def deliver(call: Callable[[], Awaitable[None]]) -> None:
        """Retry until the destination takes it; order is kept because the lane waits."""
        try:
            await call()  # the common case, without the retry machinery's cost per call
            return
        except PermanentSinkError:
            raise
        except Exception as exc:
            log.warning("sink %s: %s: %s; retrying", sink.name, type(exc).__name__, exc)
            metrics.SINK_RETRIES.labels(sink.name).inc()
            await asyncio.sleep(FIRST_RETRY_DELAY_S)  # a backoff: the loop starts with an attempt
        async for attempt in AsyncRetrying(
            retry=retry_if_not_exception_type(PermanentSinkError),
            wait=wait_exponential_jitter(initial=0.2, max=RETRY_MAX_WAIT_S),
            before_sleep=log_retry,
            reraise=True,
        ):
            with attempt:
                await call()

    def for_redrive(before: SessionContext, op: Operation) -> SessionContext:
        """The context to apply a re-driven ``op`` with: the current one, the op no
        longer listed as refused. Raises :class:`Skip` unless it was refused (a re-drive
        replayed after it succeeded, or of an operation that was never refused)."""
        key = refused_key(op)
        if key not in before.refused:
            raise Skip(f"{key} is not refused")
        return before.model_copy(
            update={
                "refused": [k for k in before.refused if k != key],
                "extra": copy.deepcopy(before.extra),  # the sink may change it
            }
        )

    async def apply_operation(
        session_id: str, message: Message, op: Operation, *, redriven: bool = False
    ) -> list[Write]:
        before = store.load(session_id)
        try:
            context = for_redrive(before, op) if redriven else before.advanced(op)
        except Skip:
            metrics.REPLAYS_SKIPPED.labels(f"sink-{sink.name}").inc()
            return []
        outcome = "redriven" if redriven else "applied"
        lanes.mark(session_id, f"delivering {op.op}")
        try:
            await deliver(lambda: sink.apply(op, context))
        except PermanentSinkError as exc:
            outcome = "refused"
            await dead_letters.write(message, f"{sink.name} refused {op.op}: {exc}")
            # Remembered, so that a re-drive applies it again past the high-water marks.
            refused = [k for k in before.refused if k != refused_key(op)] + [refused_key(op)]
            context.refused = refused[-REFUSED_KEPT:]
        written = store.save(before, context)
        count_operation(op.op, outcome)
        if redriven:
            return written
        end_to_end.observe(max(time.time() - op.emitted_at, 0.0))
        if outcome == "applied" and isinstance(op, ActionsWritten):
            applied_at = time.time()
            if op.ingested_at > 0:
                action_age.observe(max(applied_at - op.ingested_at, 0.0))
            acted_at = max((a.timestamp_end for a in op.payload.actions), default=0.0)
            if acted_at > 0:  # 0: the client sent no timestamp
                event_age.observe(max(applied_at - acted_at, 0.0))
        return written

    async def apply_link(session_id: str, message: Message, link: SessionLink) -> list[Write]:
        assert isinstance(sink, LinkAwareSink)
        before = store.load(session_id)
        context = before.model_copy(deep=True)  # the sink may change its ``extra``
        lanes.mark(session_id, "delivering a link")
        try:
            await deliver(lambda: sink.link(session_id, link.conversation_id, context))
        except PermanentSinkError as exc:
            await dead_letters.write(message, f"{sink.name} refused link: {exc}")
        return store.save(before, context)

    acks = InOrderAcks()  # lanes finish out of order; Faust must see acks in offset order

    async def erase_session(
        session_id: str, message: Message, erased: SessionErased
    ) -> list[Write]:
        """Remove what this sink delivered for the session, then its context (the pull
        view answers 404 after this); an audit line names what went, never its content."""
        context = store.load(session_id)
        lanes.mark(session_id, "erasing at the destination")
        try:
            await deliver(lambda: erase_at_destination(sink, context))
        except PermanentSinkError as exc:
            await dead_letters.write(message, f"{sink.name} refused to erase: {exc}")
        log.warning(
            "sink %s erased session %s (requested at %s, %s): %d actions, %d summaries",
            sink.name,
            session_id,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(erased.requested_at or time.time())),
            erased.reason or "no reason given",
            context.actions_to,
            context.summaries,
        )
        return store.erase(context)

    async def handle(session_id: str, item: LaneItem) -> None:
        tracked, decoded = item
        redriven = isinstance(decoded, Redriven)
        if isinstance(decoded, Redriven):
            decoded = decoded.item
        if isinstance(decoded, SessionErased):
            written = await erase_session(session_id, tracked.message, decoded)
        elif isinstance(decoded, SessionLink):
            if isinstance(sink, LinkAwareSink):
                written = await apply_link(session_id, tracked.message, decoded)
            else:
                written = []  # a link re-driven to a sink that takes none
        else:
            written = await apply_operation(session_id, tracked.message, decoded, redriven=redriven)
        lanes.mark(session_id, "waiting for its changelog records")
        # Step 1 (the destination has it) is done; the context is made durable, and
        # only then may Faust commit past this offset.
        await commit(app, lambda: acks.done(tracked), writes=written)

    lanes: Lanes[LaneItem] = Lanes(
        handle, max_pending=settings.max_in_flight_requests, on_error=app.crash_on_lane_error
    )
    app.manage_lanes(lanes, f"sink-{sink.name}")

    operations = BatchSource(app, topics.context, max_buffered=settings.batch_buffer)
    started = asyncio.Event()  # the sink's setup() ran: operations may flow

    @app.task
    async def run_sink() -> None:
        try:
            await start_sink(sink)
        except Exception as exc:  # a sink that cannot start must not consume
            await app.crash_on_lane_error(f"(setup of sink {sink.name})", exc)
        app.at_shutdown(lambda: stop_sink(sink))
        started.set()
        await feed_lanes(operations, lanes, acks, _decode, dead_letters.write)

    if isinstance(sink, LinkAwareSink):
        links = BatchSource(app, topics.links, max_buffered=settings.batch_buffer)

        @app.task
        async def run_links() -> None:
            await started.wait()
            await feed_lanes(
                links, lanes, acks, lambda raw: decode(SessionLink, raw), dead_letters.write
            )

    redrive_name = redrive_topic(f"sink-{sink.name}")
    app.own_topics.append(redrive_name)
    redriven = BatchSource(
        app, declare_topic(app, settings, redrive_name), max_buffered=settings.batch_buffer
    )

    @app.task
    async def run_redriven() -> None:
        await feed_lanes(redriven, lanes, acks, _decode_redriven, dead_letters.write)

    @app.page("/sessions/{session_id}/context")
    @app.table_route(table=contexts, match_info="session_id")
    async def session_context(web: View, request: Request, session_id: str) -> Response:
        """The pull view: like the SDK's ContextStore, without summarised actions twice."""
        if (refused := unauthorized(web, request, settings.api_token)) is not None:
            return refused
        if contexts.get(session_id) is None:
            return web.json({"error": f"no context for session {session_id!r}"}, status=404)
        return web.json(pull_view(store.load(session_id)))

    if callable(add_routes := getattr(sink, "add_routes", None)):
        add_routes(app, contexts, store.load)  # e.g. the vector sink's search and enrich
    return contexts
