"""One sink as its own Faust agent over ``context``: the stage and its delivery.

Per session, operations are applied strictly in order (one lane per session);
sessions proceed concurrently. Each operation is retried until the destination
takes it (a refused one is dead-lettered), and the session's context, with the
high-water marks that make redeliveries no-ops, is committed with the event
(``streams._faust.commit``: the destination has it, the context is durable, then
the event is acknowledged).

A sink that delivers nothing (``Sink.delivers``: null, whose agents read the pull view)
is never called: its contexts are kept, and each run of batches right after their sessions'
last is stored from the operations' bytes (``append_run``: compiled where built), no model
or context built for them; a summary is applied as the Struct msgspec decoded
(``schemas.fast.SummaryStruct``).

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
from functools import partial
from typing import Any

import msgspec
from faust.types import Message
from faust.web import Request, Response, View

from schemas import (
    ActionsWritten,
    InvalidMessage,
    SessionErased,
    SessionLink,
    SummaryReady,
    decode,
)
from schemas.fast import SummaryStruct, WrittenHeader, header_model
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
from sinks.runner.delivery import Delivery
from sinks.runner.messages import (
    LaneItem,
    Redriven,
    decode_operation,
    decode_redriven,
    pull_view,
)
from streams._faust.batch_source import BatchSource
from streams._faust.commit import Commits, Write
from streams._faust.write_behind import WriteBehind
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.lanes import InOrderAcks, Lanes, feed_lanes
from streams.observe import metrics
from streams.observe.web import unauthorized
from streams.tables import session_keyed_table
from streams.topics import Topics, declare_topic, redrive_topic

__all__ = ["SinkStage"]

log = logging.getLogger(__name__)

# An operation waits for the rest of its batch (~90 us each): small batches for latency,
# cheap since their commits are pipelined (python -m scripts.bench --mode latency).
INLINE_BATCH_MAX = 64
# What decode_operation returns: a summary as its Struct to a sink that delivers nothing.
_OPERATIONS = frozenset({ActionsWritten, SummaryReady, SummaryStruct})


class SinkStage:
    """A sink's table, lanes and sources on one worker; ``register`` wires them."""

    def __init__(self, app: ContextApp, topics: Topics, sink: ContextSink) -> None:
        settings = self.settings = app.settings
        self.app, self.sink = app, sink
        # Headers and batches of a session on one changelog partition: see ContextStore.save.
        self.contexts = session_keyed_table(app, "contexts")
        self.dead_letters = DeadLetterWriter(topics.dead_letters, stage=f"sink-{sink.name}")
        # An inline sink's writes are made durable behind it (feed_inline); its loads see them.
        self.writes = WriteBehind(app, stage=f"sink-{sink.name}", on_error=app.crash_on_lane_error)
        self.delivers = getattr(sink, "delivers", True)
        self.inline = getattr(sink, "inline", False) or not self.delivers
        self.reads_payload = getattr(sink, "reads_payload", True)  # a plug-in may read it
        self.store = ContextStore(
            app,
            self.contexts,
            cache_size=settings.sink_context_cache,
            compiled=settings.compiled,
            read=self.writes.get if self.inline else None,
            decoded=metrics.SINK_CONTEXTS_DECODED.labels(sink.name).inc,
        )
        # Bound once: ``labels()`` per operation was 3% of a sink's CPU (py-spy).
        self.end_to_end = metrics.END_TO_END.labels(sink.name)
        self.action_age = metrics.ACTION_AGE_AT_SINK.labels(sink.name)
        self.event_age = metrics.ACTION_EVENT_AGE_AT_SINK.labels(sink.name)
        self.operations_counted: dict[tuple[str, str], Any] = {}
        self.acks = InOrderAcks()  # lanes finish out of order; Faust must see acks in order
        self.commits = Commits(app)
        self.lanes: Lanes[LaneItem] = Lanes(
            self.handle,
            max_pending=settings.max_in_flight_requests,
            on_error=app.crash_on_lane_error,
        )
        app.manage_lanes(self.lanes, f"sink-{sink.name}")
        buffered = settings.batch_buffer
        self.operations = BatchSource(app, topics.context, max_buffered=buffered)
        # Only a sink that takes links reads them (a source consumes its topic).
        self.links = (
            BatchSource(app, topics.links, max_buffered=buffered)
            if isinstance(sink, LinkAwareSink)
            else None
        )
        redrive_name = redrive_topic(f"sink-{sink.name}")
        app.own_topics.append(redrive_name)
        redrive = declare_topic(app, settings, redrive_name)
        self.redriven = BatchSource(app, redrive, max_buffered=buffered)
        self.started = asyncio.Event()  # the sink's setup() ran: operations may flow
        self.inline_lock = asyncio.Lock()  # feed_inline: one batch at a time
        self.deliver = Delivery(sink.name)  # a destination's call, retried until taken

    async def run_sink(self) -> None:
        await self.app.routable(self.contexts)  # the pull view routes by the changelog
        try:
            await start_sink(self.sink)
        except Exception as exc:  # a sink that cannot start must not consume
            await self.app.crash_on_lane_error(f"(setup of sink {self.sink.name})", exc)
        self.app.at_shutdown(lambda: stop_sink(self.sink))
        self.started.set()
        decoder = partial(decode_operation, payload=self.reads_payload, header=not self.delivers)
        await self.feed(self.operations, decoder, appends=not self.delivers)

    async def run_links(self) -> None:
        await self.started.wait()
        if self.links is not None:
            await self.feed(self.links, lambda raw: decode(SessionLink, raw))

    async def run_redriven(self) -> None:
        await self.feed(self.redriven, partial(decode_redriven, payload=self.reads_payload))

    async def feed(
        self,
        source: BatchSource,
        decoder: Callable[[bytes | None], Any],
        *,
        appends: bool = False,
    ) -> None:
        if self.inline:
            await self.feed_inline(source, decoder, appends=appends)
        else:
            await feed_lanes(source, self.lanes, self.acks, decoder, self.dead_letters.write)

    async def feed_inline(
        self,
        source: BatchSource,
        decoder: Callable[[bytes | None], Any],
        *,
        appends: bool = False,
    ) -> None:
        """A sink with ``inline`` set: each fetched batch applied in order and sealed as one
        ``WriteBehind`` unit (``streams._faust.commit``'s steps for its writes, then its
        acks in offset order), made durable while the next batch is applied. One batch at a
        time across the worker's sources (``inline_lock``), so a session's contexts are
        saved and logged in the order they were made; loads read the writes still pending.
        ``appends``: runs of batches stored from their bytes first (``append_run``)."""
        shown = f"(inline batch from {source.topic.get_topic_name()})"  # by the stall report
        writes = self.writes
        async for batch in source.batches(INLINE_BATCH_MAX):
            await asyncio.sleep(0)  # the last batch's messages go out, the fetcher runs
            async with self.inline_lock:
                self.lanes.begin_outside(shown, f"applying {len(batch)} records")
                writes.track_all(source, batch)
                values = [message.value for message in batch] if appends else None
                at, end = 0, len(batch)
                while at < end:
                    if values is not None:
                        at += self.append_run(values, at)
                        if at == end:
                            break
                    message = batch[at]
                    at += 1
                    try:
                        decoded = decoder(message.value)
                    except InvalidMessage as exc:
                        await self.dead_letters.write(message, exc.reason)
                        continue
                    if type(decoded) is WrittenHeader:  # one append_run declined
                        decoded = header_model(decoded)
                    try:
                        done = await self.writes_for(decoded.session_id, message, decoded)
                    except Exception as exc:  # a bug, as in a lane: exit, nothing acked
                        await self.app.crash_on_lane_error(decoded.session_id, exc)
                        raise
                    for table, key, value in done:
                        writes.set(table, key, value)
                self.lanes.mark(shown, "waiting for room for its changelog records")
                await writes.seal()
                self.lanes.end_outside(shown)

    async def session_context(self, web: View, request: Request, session_id: str) -> Response:
        """The pull view: like the SDK's ContextStore, without summarised actions twice."""
        if (refused := unauthorized(web, request, self.settings.api_token)) is not None:
            return refused
        if self.store.get(session_id) is None:
            return web.json({"error": f"no context for session {session_id!r}"}, status=404)
        return web.json(pull_view(self.store.load(session_id)))

    def count_operation(self, op: str, outcome: str, count: int = 1) -> None:
        if (counter := self.operations_counted.get((op, outcome))) is None:
            counter = self.operations_counted[(op, outcome)] = metrics.SINK_OPERATIONS.labels(
                self.sink.name, op, outcome
            )
        counter.inc(count)

    async def handle(self, session_id: str, item: LaneItem) -> None:
        tracked, decoded = item
        writes = await self.writes_for(session_id, tracked.message, decoded)
        self.lanes.mark(session_id, "waiting for its changelog records")
        # Step 1 (the destination has it) is done; the context is made durable, and
        # only then may Faust commit past this offset.
        await self.commits.commit(lambda: self.acks.done(tracked), writes=writes)

    def writes_for(self, session_id: str, message: Message, decoded: Any) -> Awaitable[list[Write]]:
        """Step 1 for one input (the destination has it); the writes that make it durable.
        Not a coroutine itself: an operation's is awaited without a frame around it."""
        if type(decoded) in _OPERATIONS:  # nearly every input: one lookup, not four isinstance
            return self.apply_operation(session_id, message, decoded)
        return self._other_writes(session_id, message, decoded)

    async def _other_writes(self, session_id: str, message: Message, decoded: Any) -> list[Write]:
        """``writes_for`` a re-driven input, an erasure or a link."""
        redriven = isinstance(decoded, Redriven)
        if redriven:
            decoded = decoded.item
        writes: list[Write]
        if isinstance(decoded, SessionErased):
            writes = await self.erase_session(session_id, message, decoded)
        elif isinstance(decoded, SessionLink):
            if isinstance(self.sink, LinkAwareSink):
                writes = await self.apply_link(session_id, message, decoded)
            else:
                writes = []  # a link re-driven to a sink that takes none
        else:
            writes = await self.apply_operation(session_id, message, decoded, redriven=redriven)
        return writes

    def append_run(self, values: list[bytes | None], start: int) -> int:
        """For a sink that delivers nothing: ``values[start:]`` stored while each is a batch
        right after its session's last, by its slot record alone, without a model or a
        context built (``ContextStore.append_run``); how many were (test_context_append.py)."""
        count, keys, records, ages = self.store.append_run(values, start, time.time())
        if count:
            self.writes.set_all(self.contexts, keys, records)  # native's, or compacted
            self.count_operation("actions_written", "applied", count)
            self.end_to_end.observe_all(ages[0])
            self.action_age.observe_all(ages[1])
            self.event_age.observe_all(ages[2])
        return count

    def observe_ages(self, op: Operation, *, applied: bool) -> None:
        """The end-to-end latency, and for a batch applied its actions' ages."""
        applied_at = time.time()
        self.end_to_end.observe(max(applied_at - op.emitted_at, 0.0))
        if applied and isinstance(op, ActionsWritten):
            if op.ingested_at > 0:
                self.action_age.observe(max(applied_at - op.ingested_at, 0.0))
            if op.acted_at > 0:  # 0: the client sent no timestamp
                self.event_age.observe(max(applied_at - op.acted_at, 0.0))

    async def apply_operation(
        self, session_id: str, message: Message, op: Operation, *, redriven: bool = False
    ) -> list[Write]:
        sink, store = self.sink, self.store
        before = store.load(session_id)
        try:
            context = _for_redrive(before, op) if redriven else before.advanced(op)
        except Skip:
            metrics.REPLAYS_SKIPPED.labels(f"sink-{sink.name}").inc()
            return []
        outcome = "redriven" if redriven else "applied"
        self.lanes.mark(session_id, f"delivering {op.op}")
        try:
            if self.delivers:
                await self.deliver(sink.apply, op, context)
        except PermanentSinkError as exc:
            outcome = "refused"
            await self.dead_letters.write(message, f"{sink.name} refused {op.op}: {exc}")
            # Remembered, so that a re-drive applies it again past the high-water marks.
            refused = [k for k in before.refused if k != refused_key(op)] + [refused_key(op)]
            context.refused = refused[-REFUSED_KEPT:]
        writes = store.save(before, context)
        self.count_operation(op.op, outcome)
        if not redriven:
            self.observe_ages(op, applied=outcome == "applied")
        return writes

    async def apply_link(self, session_id: str, message: Message, link: SessionLink) -> list[Write]:
        sink = self.sink
        assert isinstance(sink, LinkAwareSink)
        before = self.store.load(session_id)
        context = before.copy()  # the sink may change its ``extra``
        self.lanes.mark(session_id, "delivering a link")
        try:
            await self.deliver(sink.link, session_id, link.conversation_id, context)
        except PermanentSinkError as exc:
            await self.dead_letters.write(message, f"{sink.name} refused link: {exc}")
        return self.store.save(before, context)

    async def erase_session(
        self, session_id: str, message: Message, erased: SessionErased
    ) -> list[Write]:
        """Remove what this sink delivered for the session, then its context (the pull
        view answers 404 after this); an audit line names what went, never its content."""
        sink = self.sink
        context = self.store.load(session_id)
        self.lanes.mark(session_id, "erasing at the destination")
        try:
            await self.deliver(erase_at_destination, sink, context)
        except PermanentSinkError as exc:
            await self.dead_letters.write(message, f"{sink.name} refused to erase: {exc}")
        log.warning(
            "sink %s erased session %s (requested at %s, %s): %d actions, %d summaries",
            sink.name,
            session_id,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(erased.requested_at or time.time())),
            erased.reason or "no reason given",
            context.actions_to,
            context.summaries,
        )
        return self.store.erase(context)


def _for_redrive(before: SessionContext, op: Operation) -> SessionContext:
    """The context to apply a re-driven ``op`` with: the current one, the op no longer
    listed as refused. Raises :class:`Skip` unless it was refused (a re-drive replayed
    after it succeeded, or of an operation that was never refused)."""
    key = refused_key(op)
    if key not in before.refused:
        raise Skip(f"{key} is not refused")
    return msgspec.structs.replace(
        before,
        refused=[k for k in before.refused if k != key],
        extra=copy.deepcopy(before.extra),  # the sink may change it
    )
