"""The accumulate agent: ``actions`` -> per-session table -> ``context`` + ``summarize``.

Effectively-once: what a payload produces is acknowledged by the broker *before*
the session's table entry (with the payload's offset) is written. A crash in
between replays the payload with the old state, which re-emits the same sequence
numbers; every downstream stage skips what it already applied.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import cast

import faust
from faust.types import TableT

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
from schemas import ActionsPayload, InvalidMessage, decode
from streams import metrics
from streams.app import ContextApp
from streams.dead_letters import DeadLetterWriter
from streams.lag import OwnedKeys
from streams.tables import owned_partitions, session_table
from streams.topics import MESSAGE_MAX_BYTES, Topics

__all__ = ["register"]

log = logging.getLogger(__name__)

BATCH_MAX = 500
BATCH_WITHIN_S = 0.005


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


def register(app: ContextApp, topics: Topics) -> TableT[str, bytes]:
    """Declare the session table, the agent and its timers on ``app``."""
    settings = app.settings
    limits = Limits(
        threshold=settings.threshold,
        max_actions_per_batch=settings.max_actions_per_batch,
        debounce_ms=settings.debounce_ms,
        debounce_max_ms=settings.debounce_max_ms,
    )
    sessions = session_table(app, "sessions")
    # Counted at scrape time, only on this worker's partitions (see OwnedKeys).
    metrics.ACTIVE_SESSIONS.set_function(OwnedKeys(app, sessions, topics.actions))
    dead_letters = DeadLetterWriter(topics.dead_letters, stage="accumulate")
    out_topics = {"context": topics.context, "summarize": topics.summarize}
    # The agent and the timers both read-modify-write session entries, with
    # awaits in between; one lock keeps those updates from interleaving.
    state_lock = asyncio.Lock()
    debouncing: set[str] = set()

    def load(session_id: str) -> SessionState | None:
        return _decoded(sessions.get(session_id))

    async def emit(emissions: Iterable[tuple[str, Emission]]) -> None:
        """Produce in order and wait until the broker acknowledged every message."""
        futures = [await out_topics[e.topic].send(key=sid, value=e.value) for sid, e in emissions]
        await asyncio.gather(*futures)

    async def apply_events(events: list[faust.EventT]) -> None:
        states: dict[str, SessionState | None] = {}
        encoded: dict[str, bytes | None] = {}  # each session's last accepted state, as stored
        changed: set[str] = set()
        emissions: list[tuple[str, Emission]] = []
        now = time.time()
        for event in events:
            message = event.message
            try:
                payload = decode(ActionsPayload, message.value)
            except InvalidMessage as exc:
                await dead_letters.write(message, exc.reason)
                continue
            sid = payload.session_id
            if sid not in states:
                encoded[sid] = sessions.get(sid)
                states[sid] = _decoded(encoded[sid])
            if already_applied(states[sid], message.offset):
                metrics.REPLAYS_SKIPPED.labels("accumulate").inc()
                continue
            state, out = apply_payload(states[sid], payload, message.offset, limits, now)
            raw = state.to_bytes()
            if too_large := _oversized(raw, out):
                # Fix (found by tests/test_reliability.py): a payload whose operation,
                # summarize request or state entry exceeds what the broker takes used
                # to make the send raise, crashing the agent and losing the rest of
                # the batch (take_events acks it anyway). Dead-letter it instead and
                # keep the session's state from before it (apply_payload mutated it).
                await dead_letters.write(message, too_large)
                states[sid] = _decoded(encoded[sid])
                continue
            states[sid], encoded[sid] = state, raw
            changed.add(sid)
            emissions.extend((sid, e) for e in out)
            metrics.ACTIONS_IN.inc(len(payload.actions))
            if state.debounce:
                debouncing.add(sid)
        await emit(emissions)
        for sid in changed:
            sessions[sid] = encoded[sid]

    @app.agent(topics.actions, name="accumulate")
    async def accumulate(stream: faust.StreamT[bytes]) -> None:
        async for events in cast(faust.Stream[bytes], stream).take_events(
            BATCH_MAX, within=BATCH_WITHIN_S
        ):
            async with state_lock:
                await apply_events(list(events))

    async def close_session(sid: str, state: SessionState, now: float) -> None:
        await emit((sid, e) for e in close_idle(state, limits, now))
        sessions.pop(sid, None)
        debouncing.discard(sid)
        metrics.SESSIONS_EXPIRED.inc()
        log.info("session %s idle for %.0fs: closed and expired", sid, now - state.last_seen)

    @app.timer(settings.idle_check_interval_s, name="accumulate.expire_idle")
    async def expire_idle_sessions() -> None:
        now = time.time()
        idle = []
        owned = owned_partitions(app, topics.actions)
        for sid, raw in list(sessions.items()):
            if sessions.partition_for_key(sid) not in owned:
                continue  # a stale entry of a partition another worker owns now
            state = SessionState.from_bytes(raw)
            if now - state.last_seen >= settings.idle_timeout_s:
                idle.append(sid)
            elif state.debounce:
                debouncing.add(sid)  # e.g. restored from the changelog after a restart
        for sid in idle:
            async with state_lock:
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
                        await emit((sid, e) for e in flush_debounce(state, limits, now))
                        sessions[sid] = state.to_bytes()
                        debouncing.discard(sid)

    return sessions
