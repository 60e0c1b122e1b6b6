"""Per-session accumulator state and its pure transitions (no Kafka here).

One table entry per session holds the sequence counter, the last input offset
applied (so replays after a crash are skipped), the batches not yet sent for
summarising, and the debounce buffer. Batches are stored as the JSON dicts they
will be re-emitted as, so the hot path never re-validates them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from schemas import ActionsPayload

__all__ = ["Emission", "SessionState", "apply_payload", "close_idle", "flush_debounce"]


@dataclass
class SessionState:
    generation: int
    product_id: str = ""
    conversation_id: str | None = None
    next_seq: int = 1
    last_offset: int = -1
    summarized_to: int = 0
    pending: list[dict[str, Any]] = field(default_factory=list)  # {seq_from, seq_to, payload}
    pending_actions: int = 0
    debounce: list[dict[str, Any]] = field(default_factory=list)  # payload dicts
    debounce_first: float = 0.0
    debounce_last: float = 0.0
    last_seen: float = 0.0

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)  # orjson encodes dataclasses natively (no asdict deep copy)

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionState:
        return cls(**orjson.loads(raw))


@dataclass(frozen=True)
class Emission:
    """A message to produce: ``topic`` is ``context`` or ``summarize``."""

    topic: str
    value: bytes


@dataclass(frozen=True)
class Limits:
    threshold: int
    max_actions_per_batch: int
    debounce_ms: int = 0
    debounce_max_ms: int = 2000


def _chunks(payload: ActionsPayload, size: int) -> list[ActionsPayload]:
    """Split an oversized batch so one note or prompt never exceeds ``size`` actions."""
    if len(payload.actions) <= size:
        return [payload]
    return [
        payload.model_copy(
            update={
                "actions": payload.actions[i : i + size],
                "count": len(payload.actions[i : i + size]),
            }
        )
        for i in range(0, len(payload.actions), size)
    ]


def _write_batch(
    state: SessionState, payload: ActionsPayload, limits: Limits, now: float
) -> list[Emission]:
    """Assign sequence numbers to one batch, emit it, and cross the threshold if due."""
    out: list[Emission] = []
    for chunk in _chunks(payload, limits.max_actions_per_batch):
        seq_from = state.next_seq
        seq_to = seq_from + len(chunk.actions) - 1
        state.next_seq = seq_to + 1
        if chunk.conversation_id:
            state.conversation_id = chunk.conversation_id
        body = chunk.model_dump(mode="json")
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
                        "text": chunk.to_text(),
                        "payload": body,
                        "emitted_at": now,
                    }
                ),
            )
        )
        state.pending.append({"seq_from": seq_from, "seq_to": seq_to, "payload": body})
        state.pending_actions += len(chunk.actions)
        if state.pending_actions >= limits.threshold:
            out.append(_summarize_request(state, now, final=False))
    return out


def _summarize_request(state: SessionState, now: float, *, final: bool) -> Emission:
    request = {
        "session_id": state.pending[0]["payload"]["session_id"],
        "product_id": state.product_id,
        "generation": state.generation,
        "seq_from": state.pending[0]["seq_from"],
        "seq_to": state.pending[-1]["seq_to"],
        "batches": [b["payload"] for b in state.pending],
        "final": final,
        "created_at": now,
    }
    state.summarized_to = state.pending[-1]["seq_to"]
    state.pending = []
    state.pending_actions = 0
    return Emission("summarize", orjson.dumps(request))


def flush_debounce(state: SessionState, limits: Limits, now: float) -> list[Emission]:
    """Merge the debounced payloads (SDK ``merge()`` semantics) and write them as one batch."""
    if not state.debounce:
        return []
    payloads = [ActionsPayload.model_validate(p) for p in state.debounce]
    state.debounce = []
    return _write_batch(state, ActionsPayload.merge(payloads), limits, now)


def debounce_due(state: SessionState, limits: Limits, now: float) -> bool:
    if not state.debounce:
        return False
    quiet = (now - state.debounce_last) * 1000 >= limits.debounce_ms
    too_long = (now - state.debounce_first) * 1000 >= limits.debounce_max_ms
    return quiet or too_long


def apply_payload(
    state: SessionState | None,
    payload: ActionsPayload,
    offset: int,
    limits: Limits,
    now: float | None = None,
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
    if payload.product_id:
        state.product_id = payload.product_id
    if not payload.actions:
        return state, []  # nothing to show an agent; the offset is still recorded
    if limits.debounce_ms <= 0:
        return state, _write_batch(state, payload, limits, now)
    out = flush_debounce(state, limits, now) if debounce_due(state, limits, now) else []
    if not state.debounce:
        state.debounce_first = now
    state.debounce.append(payload.model_dump(mode="json"))
    state.debounce_last = now
    return state, out


def already_applied(state: SessionState | None, offset: int) -> bool:
    return state is not None and offset <= state.last_offset


def close_idle(state: SessionState, limits: Limits, now: float) -> list[Emission]:
    """The session went idle: write what is debounced and summarise what is left."""
    out = flush_debounce(state, limits, now)
    if state.pending:
        out.append(_summarize_request(state, now, final=True))
    return out
