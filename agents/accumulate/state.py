"""Per-session accumulator state and its pure transitions (no Kafka here).

One small table entry per session holds the sequence counter, the last input
offset applied (so replays after a crash are skipped), the range of batch
indexes not yet sent for summarising, and the debounce buffer. The batches
themselves live in a :class:`BatchStore` under (session, index), written once
each: a payload costs its own bytes in the changelog, not the whole buffer
again (O(1) per action, not O(K)). The indexes are slots: a summarize request
leaves its batches where they are and the next batches reuse indexes from 0,
so no batch costs a deletion until the session's close deletes its slots. They
are stored as the JSON they are re-emitted as, so the hot path never
re-validates them. A payload arrives as a :class:`schemas.fast.Payload` Struct:
no pydantic model is built per payload.

``native/src/transition.rs`` writes the common case's bytes too (``agents.accumulate.compiled``):
a change to what this module writes is a change there (tests/unit/test_compiled.py fails
until both agree).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import msgspec
import orjson

from schemas import ActionsPayload
from schemas.actions import numbered_text
from schemas.fast import Payload, encode_payload, payload_struct
from schemas.records import JsonRecord
from streams.tables import batch_key

if TYPE_CHECKING:
    from agents.pii import PiiFilter

__all__ = [
    "BatchStore",
    "Emission",
    "MemoryBatchStore",
    "SessionState",
    "Transition",
    "apply_payload",
    "close_idle",
    "flush_debounce",
]


class BatchStore(Protocol):
    """Where un-summarised batches wait, by (session, slot index)."""

    def put(self, session_id: str, index: int, body: bytes) -> None: ...

    def take(self, session_id: str, first: int, end: int) -> list[bytes]:
        """Return the batches ``first .. end - 1``; their slots stay until reused or deleted."""
        ...

    def delete(self, session_id: str, end: int) -> None:
        """Forget the slots ``0 .. end - 1``: the session is closed or erased."""
        ...


class MemoryBatchStore:
    """A :class:`BatchStore` in a dict (tests, tools), by ``batch_key``; each change kept at
    once. The compiled transition reads and puts in the same dict (``staged``, ``written``)."""

    def __init__(self) -> None:
        self.batches: dict[str, bytes | None] = {}
        self.staged = self.written = self.batches

    def put(self, session_id: str, index: int, body: bytes) -> None:
        self.batches[batch_key(session_id, index)] = body

    def take(self, session_id: str, first: int, end: int) -> list[bytes]:
        return [cast(bytes, self.batches[batch_key(session_id, i)]) for i in range(first, end)]

    def delete(self, session_id: str, end: int) -> None:
        for i in range(end):
            self.batches.pop(batch_key(session_id, i), None)


@dataclass
class SessionState(JsonRecord):
    generation: int
    product_id: str = ""
    conversation_id: str | None = None
    next_seq: int = 1
    last_offset: int = -1
    summarized_to: int = 0
    first_batch: int = 0  # pending batches are first_batch .. next_batch - 1 in the store
    next_batch: int = 0
    # Summarize requests leave their batches in slots 0 .. batch_slots - 1 for the next
    # batches to overwrite (_summarize_request); the close deletes them (slots_used).
    batch_slots: int = 0
    pending_actions: int = 0
    pending_bytes: int = 0
    debounce: list[dict[str, Any]] = field(default_factory=list)  # payload dicts
    debounce_first: float = 0.0
    debounce_last: float = 0.0
    last_seen: float = 0.0
    # When the newest applied input record was written to Kafka (its timestamp): the
    # sinks measure an action's age from it, a clock this service controls.
    ingested_at: float = 0.0

    @property
    def pending_batches(self) -> int:
        return self.next_batch - self.first_batch

    @property
    def slots_used(self) -> int:
        """The batch slots that may hold a batch: what the session's close deletes."""
        return max(self.batch_slots, self.next_batch)


class Emission(NamedTuple):
    """A message to produce: ``topic`` is ``context`` or ``summarize``. A tuple: 0.3 against
    0.85 µs a frozen dataclass, one or two a payload (docs/performance.md)."""

    topic: str
    value: bytes


class Transition(NamedTuple):
    """What one payload did: its session's new entry (None: its offset was applied before,
    skipped), what to emit, whether the session had an entry, the actions applied, and
    the state the entry encodes (None: applied by the compiled transition, which decodes
    none)."""

    session_id: str
    entry: bytes | None
    out: list[Emission]
    existed: bool
    actions: int
    state: SessionState | None


@dataclass(frozen=True)
class Limits:
    threshold: int
    max_actions_per_batch: int
    debounce_ms: int = 0
    debounce_max_ms: int = 2000
    # A summary is requested early, before K actions, when the pending batches
    # would exceed this: one summarize request must fit in a broker message.
    max_pending_bytes: int = 512 * 1024
    pii: PiiFilter | None = None  # AC_PII=llm,destinations: filtered before anything is kept


def _chunks(payload: Payload, size: int) -> list[Payload]:
    """Split an oversized batch so one note or prompt never exceeds ``size`` actions."""
    if len(payload.actions) <= size:
        return [payload]
    replace = msgspec.structs.replace
    return [
        replace(
            payload, actions=payload.actions[i : i + size], count=len(payload.actions[i : i + size])
        )
        for i in range(0, len(payload.actions), size)
    ]


def _latest_end(actions: list[Any]) -> float:
    """``max(a.timestamp_end for a in actions)``, 0.0 for none: a loop, where max() with a
    generator and ``default=`` cost 1 µs a batch against 0.2 (test_latest_end_is_max)."""
    latest = actions[0].timestamp_end if actions else 0.0
    for action in actions:
        if action.timestamp_end > latest:
            latest = action.timestamp_end
    return latest


def _write_batch(
    state: SessionState, payload: Payload, limits: Limits, now: float, store: BatchStore
) -> list[Emission]:
    """Assign sequence numbers to one batch, emit it, and cross the threshold if due."""
    out: list[Emission] = []
    for chunk in _chunks(payload, limits.max_actions_per_batch):
        body = encode_payload(chunk)
        if state.pending_batches and state.pending_bytes + len(body) > limits.max_pending_bytes:
            out.append(_summarize_request(state, chunk.session_id, now, store, final=False))
        seq_from = state.next_seq
        seq_to = seq_from + len(chunk.actions) - 1
        state.next_seq = seq_to + 1
        if chunk.conversation_id:
            state.conversation_id = chunk.conversation_id
        out.append(
            Emission(
                "context",
                orjson.dumps(
                    {
                        "op": "actions_written",
                        "session_id": chunk.session_id,
                        "product_id": chunk.product_id,
                        "conversation_id": state.conversation_id,
                        "generation": state.generation,
                        "seq_from": seq_from,
                        "seq_to": seq_to,
                        "text": numbered_text(chunk.session_id, chunk.actions, seq_from),
                        "payload": orjson.Fragment(body),
                        "emitted_at": now,
                        "ingested_at": state.ingested_at,
                        "acted_at": _latest_end(chunk.actions),
                    }
                ),
            )
        )
        slot = state.next_batch
        state.next_batch += 1
        state.pending_actions += len(chunk.actions)
        state.pending_bytes += len(body)
        if state.pending_actions < limits.threshold:
            store.put(chunk.session_id, slot, body)
        else:  # taken at once by its request: never stored (no slot write, no record)
            out.append(
                _summarize_request(state, chunk.session_id, now, store, final=False, last=body)
            )
    return out


def _summarize_request(
    state: SessionState,
    session_id: str,
    now: float,
    store: BatchStore,
    *,
    final: bool,
    last: bytes | None = None,
) -> Emission:
    """Everything after the last summary, sent for summarising.

    The batches stay in their slots, which the next batches overwrite from 0: no
    deletion per batch. A replay after a crash can find a slot overwritten by a batch
    written after this request; the request it then builds again repeats this one's
    range and is skipped downstream, because no overwrite is durable before this
    request is (outputs are acknowledged before table writes; test_session_state.py,
    ``test_a_replay_over_reused_slots_repeats_the_request_it_replays``).
    A ``final`` request may hold no batches: it still closes the generation. ``last``:
    the pending batches' last, which was not put (the request takes it at once).
    """
    stored_to = state.next_batch - (last is not None)
    batches = store.take(session_id, state.first_batch, stored_to)
    if last is not None:
        batches.append(last)
    request = {
        "session_id": session_id,
        "product_id": state.product_id,
        "generation": state.generation,
        "seq_from": state.summarized_to + 1,
        "seq_to": state.next_seq - 1,
        "batches": [orjson.Fragment(b) for b in batches],
        "final": final,
        "created_at": now,
    }
    state.summarized_to = state.next_seq - 1
    state.batch_slots = state.slots_used
    state.first_batch = state.next_batch = 0
    state.pending_actions = 0
    state.pending_bytes = 0
    return Emission("summarize", orjson.dumps(request))


def flush_debounce(
    state: SessionState, limits: Limits, now: float, store: BatchStore
) -> list[Emission]:
    """Merge the debounced payloads (SDK ``merge()`` semantics) and write them as one batch."""
    if not state.debounce:
        return []
    payloads = [ActionsPayload.model_validate(p) for p in state.debounce]
    state.debounce = []
    return _write_batch(state, payload_struct(ActionsPayload.merge(payloads)), limits, now, store)


def debounce_due(state: SessionState, limits: Limits, now: float) -> bool:
    if not state.debounce:
        return False
    quiet = (now - state.debounce_last) * 1000 >= limits.debounce_ms
    too_long = (now - state.debounce_first) * 1000 >= limits.debounce_max_ms
    return quiet or too_long


def apply_payload(
    state: SessionState | None,
    payload: Payload,
    offset: int,
    limits: Limits,
    now: float | None = None,
    *,
    store: BatchStore,
    ingested_at: float | None = None,
) -> tuple[SessionState, list[Emission]]:
    """Apply one consumed payload. Returns the new state and what to emit.

    A payload at or below ``last_offset`` was applied before a crash and is
    skipped (the caller checks :func:`already_applied` first).
    """
    now = time.time() if now is None else now
    if state is None:
        state = SessionState(generation=offset, product_id=payload.product_id)
    state.last_offset = offset
    state.last_seen = now
    state.ingested_at = ingested_at or now
    if payload.product_id:
        state.product_id = payload.product_id
    if not payload.actions:
        return state, []  # nothing to show an agent; the offset is still recorded
    if limits.pii is not None:  # before the debounce buffer, the store, the ledger and the text
        payload = limits.pii.redact([payload], payload.session_id)[0]
    if limits.debounce_ms <= 0:
        return state, _write_batch(state, payload, limits, now, store)
    out = flush_debounce(state, limits, now, store) if debounce_due(state, limits, now) else []
    if not state.debounce:
        state.debounce_first = now
    state.debounce.append(msgspec.to_builtins(payload))
    state.debounce_last = now
    return state, out


def already_applied(state: SessionState | None, offset: int) -> bool:
    return state is not None and offset <= state.last_offset


def close_idle(
    state: SessionState, session_id: str, limits: Limits, now: float, store: BatchStore
) -> list[Emission]:
    """The session went idle: write what is debounced and summarise what is left.

    Every session that was ever summarised gets a final request, with or without
    batches: the summarize stage keeps the session's summary state until that
    request and drops it then (the close is the only end of that state, so no
    clock there can forget a session that is still going; docs/context-fidelity.md).
    """
    out = flush_debounce(state, limits, now, store)
    if state.pending_batches or state.summarized_to:
        out.append(_summarize_request(state, session_id, now, store, final=True))
    store.delete(session_id, state.slots_used)
    return out
