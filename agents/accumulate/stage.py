"""The accumulate agent: ``actions`` -> per-session tables -> ``context`` + ``summarize``.

Effectively-once: what a payload produces is acknowledged by the broker *before*
the session's table entries (with the payload's offset) are written, and those
before the payload is acknowledged (``streams._faust.write_behind``: the agent does
not wait for that, it goes on with the next batch). A crash in between replays
the payload with the old state, which re-emits the same sequence numbers; every
downstream stage skips what it already applied.

One table, keyed by session: a small entry per session under its id, and
each un-summarised batch once under ``batch_key(session, index)``, so the
changelog grows by O(1) per action, and all of a session's records are on one
changelog partition in the order they were written (``WriteBehind``'s
crash-consistent order relies on that).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import cast

import orjson
from faust.types import Message, TableT

from agents.pii import build_pii_filter
from agents.session_state import (
    Emission,
    Limits,
    SessionState,
    already_applied,
    apply_payload,
    close_idle,
    debounce_due,
    flush_debounce,
)
from schemas import ActionsPayload, EraseRequest, InvalidMessage, SessionErased, decode
from streams._faust.batch_source import BatchSource
from streams._faust.write_behind import WriteBehind
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.observe import metrics
from streams.tables import (
    OwnedKeyCount,
    ScanPacer,
    batch_key,
    owned_partitions,
    session_items,
    session_keyed_table,
)
from streams.topics import MESSAGE_MAX_BYTES, Topics

__all__ = ["register"]

log = logging.getLogger(__name__)

BATCH_MAX = 500


def _decoded(raw: bytes | None) -> SessionState | None:
    return None if raw is None else SessionState.from_bytes(raw)


def _oversized(state: bytes, out: list[Emission]) -> str | None:
    """Why this payload cannot be applied within the broker's message limit, if it cannot.

    The state must stay under half the limit: a debounce flush or an idle close
    later emits what it holds as one operation of up to about twice its size.
    """
    biggest = max((len(e.value) for e in out), default=0)
    if biggest > MESSAGE_MAX_BYTES:
        return (
            f"payload too large: its {biggest}-byte operation exceeds the "
            f"{MESSAGE_MAX_BYTES}-byte message limit"
        )
    if len(state) > MESSAGE_MAX_BYTES // 2:
        return (
            f"payload too large: the session's pending state would be {len(state)} bytes, "
            f"over {MESSAGE_MAX_BYTES // 2} (half the message limit)"
        )
    return None


class _TableBatches:
    """The ``BatchStore`` of the session transitions, over the sessions table.

    Changes are staged until ``commit``: a payload that is dead-lettered after
    its transition ran must leave the store as it was (``discard``).
    """

    def __init__(self, table: TableT[str, bytes], writes: WriteBehind) -> None:
        self._table, self._writes = table, writes
        self._staged: dict[str, bytes | None] = {}  # None: taken (delete on commit)

    def put(self, session_id: str, index: int, body: bytes) -> None:
        self._staged[batch_key(session_id, index)] = body

    def take(self, session_id: str, first: int, end: int) -> list[bytes]:
        bodies = []
        for index in range(first, end):
            key = batch_key(session_id, index)
            if self._staged.get(key) is not None:
                bodies.append(cast(bytes, self._staged.pop(key)))  # put by this change
                continue
            body = self._writes.get(self._table, key)
            if body is None:  # a bug, not bad input: the state and the store disagree
                raise RuntimeError(f"session {session_id}: pending batch {index} is missing")
            bodies.append(body)
            self._staged[key] = None
        return bodies

    def commit(self) -> None:
        for key, body in self._staged.items():
            self._writes.set(self._table, key, body)
        self._staged.clear()

    def discard(self) -> None:
        self._staged.clear()


def register(app: ContextApp, topics: Topics) -> TableT[str, bytes]:
    """Declare the tables, the agent and its timers on ``app``."""
    settings = app.settings
    pii = build_pii_filter(settings)
    limits = Limits(
        threshold=settings.threshold,
        max_actions_per_batch=settings.max_actions_per_batch,
        debounce_ms=settings.debounce_ms,
        debounce_max_ms=settings.debounce_max_ms,
        max_pending_bytes=MESSAGE_MAX_BYTES // 2,
        ledger=settings.ledger_limits(),
        pii=pii if pii is not None and pii.destinations else None,
    )
    sessions = session_keyed_table(app, "sessions")

    # Crash-safe order (streams._faust.commit.session_rank): batches, session entry, deletions.
    writes = WriteBehind(app, on_error=app.crash_on_lane_error)
    store = _TableBatches(sessions, writes)
    # Only this worker's partitions; kept up to date by save() (see OwnedKeyCount).
    active = OwnedKeyCount(app, sessions, topics.actions, lambda: writes.pending(sessions))
    metrics.ACTIVE_SESSIONS.set_function(active)
    dead_letters = DeadLetterWriter(topics.dead_letters, stage="accumulate")
    out_topics = {
        "context": topics.context.get_topic_name(),
        "summarize": topics.summarize.get_topic_name(),
    }
    # The agent and the timers both read-modify-write session entries and emit
    # in between; one lock keeps a session's emissions and updates in order.
    state_lock = asyncio.Lock()
    debouncing: set[str] = set()

    def load(session_id: str) -> SessionState | None:
        return _decoded(writes.get(sessions, session_id))

    def save(session_id: str, raw: bytes | None, *, existed: bool = True) -> None:
        writes.set(sessions, session_id, raw)
        if existed != (raw is not None):
            active.changed(session_id, 1 if raw is not None else -1)

    async def emit(emissions: Iterable[tuple[str, Emission]]) -> None:
        """Produce in order; ``writes.seal()`` makes the table writes wait for the acks."""
        for sid, e in emissions:
            await writes.send(out_topics[e.topic], sid, e.value)

    async def apply_messages(messages: list[Message]) -> None:
        emissions: list[tuple[str, Emission]] = []
        now = time.time()
        for message in messages:
            writes.track(source, message)
            if b'"erase"' in (message.value or b"") and (erase := erase_request(message)):
                emissions.extend(forget(erase, now))
                continue
            try:
                payload = decode(ActionsPayload, message.value)
            except InvalidMessage as exc:
                await dead_letters.write(message, exc.reason)
                continue
            sid = payload.session_id
            state = load(sid)
            is_new = state is None
            if already_applied(state, message.offset):
                metrics.REPLAYS_SKIPPED.labels("accumulate").inc()
                continue
            state, out = apply_payload(
                state,
                payload,
                message.offset,
                limits,
                now,
                store=store,
                ingested_at=message.timestamp,
            )
            raw = state.to_bytes()
            if too_large := _oversized(raw, out):
                # Fix (found by tests/test_reliability.py): a payload whose operation or
                # state entry exceeds what the broker takes used to make the send raise,
                # crashing the agent. Dead-letter it instead; nothing of it was stored
                # (its batch writes were only staged) and the session's state stays.
                store.discard()
                await dead_letters.write(message, too_large)
                continue
            store.commit()
            save(sid, raw, existed=not is_new)
            emissions.extend((sid, e) for e in out)
            metrics.ACTIONS_IN.inc(len(payload.actions))
            if state.debounce:
                debouncing.add(sid)
        await emit(emissions)
        await writes.seal()

    def erase_request(message: Message) -> EraseRequest | None:
        try:
            data = orjson.loads(message.value or b"")
        except orjson.JSONDecodeError:
            return None  # decode() says why, below
        if not isinstance(data, dict) or data.get("type") != "erase":
            return None  # an actions payload that merely contains the word
        return EraseRequest.model_validate(data)

    def forget(erase: EraseRequest, now: float) -> list[tuple[str, Emission]]:
        """Erase a session here: its state and pending batches; tell the later stages."""
        sid = erase.session_id
        state = load(sid)
        if state is not None:
            store.take(sid, state.first_batch, state.next_batch)  # tombstones on commit
            store.commit()
            save(sid, None)
            debouncing.discard(sid)
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

    source = BatchSource(app, topics.actions, max_buffered=settings.batch_buffer)

    @app.task
    async def accumulate() -> None:
        async for batch in source.batches(BATCH_MAX):
            try:
                async with state_lock:
                    await apply_messages(batch)
            except Exception as exc:  # a bug: stop rather than skip (nothing here is acked)
                first = batch[0]
                await app.crash_on_lane_error(f"(batch from {first.tp}@{first.offset})", exc)

    async def close_session(sid: str, state: SessionState, now: float) -> None:
        await emit((sid, e) for e in close_idle(state, sid, limits, now, store))
        store.commit()
        save(sid, None)
        await writes.seal()
        debouncing.discard(sid)
        metrics.SESSIONS_EXPIRED.inc()
        log.info("session %s idle for %.0fs: closed and expired", sid, now - state.last_seen)

    pacer = ScanPacer("accumulate.expire_idle")

    @app.timer(settings.idle_check_interval_s, name="accumulate.expire_idle")
    async def expire_idle_sessions() -> None:
        if not pacer.due():
            return
        now = time.time()
        idle = []
        # Outside the pacer's clock: the log-end lookup waits on the broker, and on a busy
        # loop that wait put the next scan 9x as far off (a 7 s gap closed after 17 s;
        # tests/test_fidelity.py, the session "gap-long").
        readable = await source.caught_up()
        with pacer.scanning():
            async for sid, raw in session_items(sessions, readable):
                state = SessionState.from_bytes(raw)
                if now - state.last_seen >= settings.idle_timeout_s:
                    idle.append(sid)
                elif state.debounce:
                    debouncing.add(sid)  # e.g. restored from the changelog after a restart
        for sid in idle:
            async with state_lock:
                if sessions.partition_for_key(sid) not in owned_partitions(app, topics.actions):
                    continue  # revoked while the scan ran: its new owner closes it
                current = load(sid)  # it may have moved on while we waited for the lock
                if current is not None and now - current.last_seen >= settings.idle_timeout_s:
                    await close_session(sid, current, now)

    if settings.debounce_ms > 0:

        @app.timer(max(settings.debounce_ms / 4000, 0.01), name="accumulate.flush_debounce")
        async def flush_debounced() -> None:
            now = time.time()
            owned = owned_partitions(app, topics.actions)
            for sid in list(debouncing):
                async with state_lock:
                    state = load(sid) if sessions.partition_for_key(sid) in owned else None
                    if state is None or not state.debounce:
                        debouncing.discard(sid)
                        continue
                    if debounce_due(state, limits, now):
                        await emit((sid, e) for e in flush_debounce(state, limits, now, store))
                        store.commit()
                        save(sid, state.to_bytes())
                        await writes.seal()
                        debouncing.discard(sid)

    return sessions
