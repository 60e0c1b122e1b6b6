"""The accumulate stage: ``actions`` -> per-session tables -> ``context`` + ``summarize``.

Effectively-once: what a payload produces is acknowledged by the broker *before*
the session's table entries (with the payload's offset) are written, and those
before the payload is acknowledged (the commit protocol, ``streams._faust.commit``,
pipelined by ``WriteBehind``: the agent goes on with the next batch). A crash in
between replays the payload with the old state, which re-emits the same sequence
numbers; every downstream stage skips what it already applied.

One table, keyed by session: a small entry per session under its id, and
each un-summarised batch once under ``batch_key(session, slot)`` (slots reused
after each summarize request, deleted at the close), so the changelog grows by
O(1) per action, and all of a session's records are on one changelog partition
in the order they were written: a crash keeps a prefix of each unit's writes, made
in crash-safe order (``TableBatches.commit``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from functools import partial
from typing import cast

import orjson
from faust.types import Message
from pydantic import ValidationError

from agents.accumulate.batches import TableBatches, oversized
from agents.accumulate.compiled import compiled_for, run_transitions
from agents.accumulate.state import (
    Emission,
    Limits,
    SessionState,
    Transition,
    already_applied,
    apply_payload,
    close_idle,
    debounce_due,
    flush_debounce,
)
from agents.pii import build_pii_filter
from schemas import EraseRequest, InvalidMessage, SessionErased
from schemas.codec import describe
from schemas.fast import decode_payload
from streams._faust.batch_source import BatchSource
from streams._faust.write_behind import WriteBehind
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.observe import metrics
from streams.tables import (
    DecodedEntries,
    OwnedKeyCount,
    ScanPacer,
    owned_partitions,
    session_items,
    session_keyed_table,
)
from streams.topics import MESSAGE_MAX_BYTES, Topics

__all__ = ["BATCH_MAX", "Accumulator"]

log = logging.getLogger(__name__)

# Payloads per unit: an output waits for the rest of its unit, so the latency follows a
# unit's work (~64 x 0.2 ms); WriteBehind drains the units sealed meanwhile in one step.
BATCH_MAX = 64


class Accumulator:
    """The agent and its timers over one sessions table; ``register`` wires them."""

    def __init__(self, app: ContextApp, topics: Topics) -> None:
        settings = self.settings = app.settings
        self.app, self.topics = app, topics
        pii = build_pii_filter(settings)
        self.limits = Limits(
            threshold=settings.threshold,
            max_actions_per_batch=settings.max_actions_per_batch,
            debounce_ms=settings.debounce_ms,
            debounce_max_ms=settings.debounce_max_ms,
            max_pending_bytes=MESSAGE_MAX_BYTES // 2,
            pii=pii if pii is not None and pii.destinations else None,
        )
        self.sessions = sessions = session_keyed_table(app, "sessions")
        self.writes = writes = WriteBehind(
            app, stage="accumulate", on_error=app.crash_on_lane_error
        )
        self.store = TableBatches(sessions, writes)
        self.decoded = DecodedEntries(SessionState.from_bytes)  # the Python path's states
        # Only this worker's partitions; kept up to date by save() (see OwnedKeyCount).
        self.active = OwnedKeyCount(app, sessions, topics.actions, lambda: writes.pending(sessions))
        metrics.ACTIVE_SESSIONS.set_function(self.active)
        self.dead_letters = DeadLetterWriter(topics.dead_letters, stage="accumulate")
        self.out_topics = {
            "context": topics.context.get_topic_name(),
            "summarize": topics.summarize.get_topic_name(),
        }
        # The agent and the timers both read-modify-write session entries and emit
        # in between; one lock keeps a session's emissions and updates in order.
        self.state_lock = asyncio.Lock()
        self.debouncing: set[str] = set()
        self.source = BatchSource(app, topics.actions, max_buffered=settings.batch_buffer)
        self.compiled = compiled_for(self.limits, enabled=settings.compiled)
        self.entry = partial(writes.get, sessions)  # a session's entry, for the compiled path
        self.pacer = ScanPacer("accumulate.expire_idle")

    def load(self, session_id: str) -> SessionState | None:
        return self.decoded.take(session_id, self.writes.get(self.sessions, session_id))

    def save(
        self,
        session_id: str,
        raw: bytes | None,
        *,
        existed: bool = True,
        state: SessionState | None = None,
    ) -> None:
        """The session's entry ``raw`` with the batches it staged (``TableBatches.commit``);
        ``state``: what ``raw`` encodes, kept for the session's next payload."""
        writes = self.writes
        self.store.commit(session_id, raw)
        if state is not None and raw is not None:
            self.decoded.keep(session_id, cast(bytes, writes.get(self.sessions, session_id)), state)
        if existed != (raw is not None):
            self.active.changed(session_id, 1 if raw is not None else -1)

    async def emit(self, emissions: Iterable[tuple[str, Emission]]) -> None:
        """Produce in order; ``writes.seal()`` makes the table writes wait for the acks."""
        topics = self.out_topics
        # A summarize request only once its batches are in: else its summary can reach
        # the sinks first (chaos.py --cluster; tests/unit/test_write_behind.py).
        await self.writes.send_all(
            (topics[e.topic], sid, e.value, e.topic == "summarize") for sid, e in emissions
        )

    async def run(self) -> None:
        """The agent: batches of the actions topic, applied under the state lock."""
        async for batch in self.source.batches(BATCH_MAX):
            try:
                async with self.state_lock:
                    await self.apply_messages(batch)
            except Exception as exc:  # a bug: stop rather than skip (nothing here is acked)
                first = batch[0]
                await self.app.crash_on_lane_error(f"(batch from {first.tp}@{first.offset})", exc)
            await asyncio.sleep(0)  # its messages go out while the next batch is applied

    async def apply_messages(self, messages: list[Message]) -> None:
        writes, store, dead_letters = self.writes, self.store, self.dead_letters
        writes.track_all(self.source, messages)
        emissions: list[tuple[str, Emission]] = []
        now, applied, compiled, index = time.time(), 0, 0, 0
        while index < len(messages):
            if self.compiled:  # the payloads in a row that the compiled transition takes
                if emissions:  # the Python path's first: a session's operations in order
                    await self.emit(emissions)
                    emissions = []
                ran, actions, replays = await self.run_compiled(messages, index, now)
                compiled += ran - index - replays  # applied, as the Python path counts them
                applied += actions
                if ran == len(messages):
                    break
                index = ran
            message = messages[index]
            index += 1
            try:
                done = self.transition(message, now)
            except InvalidMessage as exc:
                await dead_letters.write(message, exc.reason)
                continue
            if done is None:
                metrics.REPLAYS_SKIPPED.labels("accumulate").inc()
                continue
            if not isinstance(done, Transition):  # an erasure request
                emissions.extend(self.forget(done, now))
                continue
            sid, raw, out, existed, actions, state = done
            assert raw is not None and state is not None  # a replay returned None above
            if too_large := oversized(raw, out):
                # An operation or state entry over the broker's limit made the send raise
                # (tests/integration/test_reliability.py): dead-lettered, nothing of it stored.
                # The compiled transition declines such a payload (test_compiled.py).
                store.discard()
                await dead_letters.write(message, too_large)
                continue
            self.save(sid, raw, existed=existed, state=state)
            emissions.extend((sid, e) for e in out)
            applied += actions
            if state.debounce:
                self.debouncing.add(sid)
        metrics.ACTIONS_IN.inc(applied)  # once per batch: prometheus_client locks per call
        metrics.COMPILED_PAYLOADS.inc(compiled)
        await self.emit(emissions)
        await writes.seal()

    async def run_compiled(
        self, messages: list[Message], start: int, now: float
    ) -> tuple[int, int, int]:
        """``messages`` from ``start`` through the compiled transition, each recorded and
        emitted as the Python path records and emits it, until one it declines: (that
        one's index, or the end; the actions applied; the replays skipped).
        tests/unit/test_accumulate_run.py."""
        context = self.out_topics["context"]
        partitions = self.app.appender.partition_count(context)
        if partitions is None:  # the first operation of a worker waits for the metadata
            partitions = 0
        self.store.current(self.app.consumer_generation_id)  # before its ``written``
        _, ran, actions, replays, new_sessions, runs = self.writes.run_compiled(
            run_transitions,
            self.sessions,
            messages,
            start,
            self.entry,
            self.store.written,
            self.store.kept,
            self.out_topics["summarize"],
            partitions,
            now,
            self.limits,
        )
        for sid in new_sessions:
            self.active.changed(sid, 1)
        if replays:
            metrics.REPLAYS_SKIPPED.labels("accumulate").inc(replays)
        await self.writes.send_runs(context, runs)
        return ran, actions, replays

    def transition(self, message: Message, now: float) -> Transition | EraseRequest | None:
        """One payload applied to its session by the Python transition (the compiled run
        declined it, or is not built); None for an offset applied before; an erasure
        request as it is (the stage forgets the session)."""
        value, offset = message.value, message.offset
        # Looked for only in what the compiled transition declined (it declines erasures):
        # the search through every payload's bytes was 0.8% of the worker (perf, session 41).
        if value is not None and b'"erase"' in value and (erase := _erase_request(value)):
            return erase
        payload = decode_payload(value)
        sid = payload.session_id
        state = self.load(sid)
        if already_applied(state, offset):
            return None
        existed = state is not None
        at = message.timestamp
        state, out = apply_payload(
            state, payload, offset, self.limits, now, store=self.store, ingested_at=at
        )
        return Transition(sid, state.to_bytes(), out, existed, len(payload.actions), state)

    def forget(self, erase: EraseRequest, now: float) -> list[tuple[str, Emission]]:
        """Erase a session here: its state and pending batches; tell the later stages."""
        sid = erase.session_id
        state = self.load(sid)
        if state is not None:
            self.store.delete(sid, state.slots_used)  # tombstones on commit
            self.save(sid, None)
            self.debouncing.discard(sid)
        log.warning(
            "erased session %s as requested at %s (%s): accumulator state %s",
            sid,
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(erase.requested_at or now)),
            erase.reason or "no reason given",
            "deleted" if state is not None else "already gone",
        )
        value = (
            SessionErased(
                session_id=sid, requested_at=erase.requested_at, reason=erase.reason, emitted_at=now
            )
            .model_dump_json()
            .encode()
        )
        return [(sid, Emission("summarize", value)), (sid, Emission("context", value))]

    async def close_session(self, sid: str, state: SessionState, now: float) -> None:
        await self.emit((sid, e) for e in close_idle(state, sid, self.limits, now, self.store))
        self.save(sid, None)
        await self.writes.seal()
        self.debouncing.discard(sid)
        metrics.SESSIONS_EXPIRED.inc()
        log.info("session %s idle for %.0fs: closed and expired", sid, now - state.last_seen)

    async def expire_idle_sessions(self) -> None:
        """Timer: close the sessions idle for ``AC_IDLE_TIMEOUT_S`` (paced scans)."""
        if not self.pacer.due():
            return
        timeout = self.settings.idle_timeout_s
        now = time.time()
        idle = []
        # Outside the pacer's clock: the log-end lookup waits on the broker, and on a busy loop
        # that wait put the next scan 9x as far off (test_fidelity.py, "gap-long").
        readable = await self.source.caught_up()
        with self.pacer.scanning():
            async for sid, raw in session_items(self.sessions, readable):
                state = SessionState.from_bytes(raw)
                if now - state.last_seen >= timeout:
                    idle.append(sid)
                elif state.debounce:
                    self.debouncing.add(sid)  # e.g. restored from the changelog after a restart
        for sid in idle:
            async with self.state_lock:
                if self.sessions.partition_for_key(sid) not in owned_partitions(
                    self.app, self.topics.actions
                ):
                    continue  # revoked while the scan ran: its new owner closes it
                current = self.load(sid)  # it may have moved on while we waited for the lock
                if current is not None and now - current.last_seen >= timeout:
                    await self.close_session(sid, current, now)

    async def flush_debounced(self) -> None:
        """Timer (``AC_DEBOUNCE_MS`` > 0): emit the debounced batches that are due."""
        now = time.time()
        owned = owned_partitions(self.app, self.topics.actions)
        for sid in list(self.debouncing):
            async with self.state_lock:
                state = self.load(sid) if self.sessions.partition_for_key(sid) in owned else None
                if state is None or not state.debounce:
                    self.debouncing.discard(sid)
                    continue
                if debounce_due(state, self.limits, now):
                    flushed = flush_debounce(state, self.limits, now, self.store)
                    await self.emit((sid, e) for e in flushed)
                    self.save(sid, state.to_bytes(), state=state)
                    await self.writes.seal()
                    self.debouncing.discard(sid)


def _erase_request(value: bytes) -> EraseRequest | None:
    """The erasure request ``value`` holds, None if it holds none; InvalidMessage for a
    malformed one (it crashed the worker on every restart before: test_erasure.py)."""
    try:
        data = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None  # decode_payload() says why, below
    if not isinstance(data, dict) or data.get("type") != "erase":
        return None  # an actions payload that merely contains the word
    try:
        return EraseRequest.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(f"invalid erase request: {describe(exc)}") from None
