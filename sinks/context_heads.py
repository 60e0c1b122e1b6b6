"""The heads of a store's cached contexts, for a sink that delivers nothing: its batches
stored from the operations' bytes (``ContextStore.append_run``), no model or context built.

For each session whose context ``ContextStore`` has cached and may take appends (armed by
the store: not closed, not stored before slots, past its first batch), the head of that
context: its generation, last action, next slot, slots used, and the batches appended
since the store last loaded it (``take``). ``append`` reads a run of operations in order
and stores each ``actions_written`` that comes right after its session's last action, of
its generation, as its slot's record (way 1 of ``sinks.context_store``); it stops at the
first it declines, which the stage applies by the general path (``load``, ``advanced``,
``save``), so declining is always safe.

:class:`Heads` is the Python twin of ``native.Appends`` (``native/src/appends.rs``), which
reads the bytes itself and declines more (text msgspec would escape its own way); both
store what the general path stores (tests/unit/test_context_append.py). ``heads()`` picks.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from schemas.codec import InvalidMessage
from schemas.fast import WrittenHeader, decode_context_message
from streams._faust.stores import compact
from streams.native import native
from streams.tables import batch_key

__all__ = ["Appended", "Heads", "Slot", "heads", "slot_key"]


class Slot(msgspec.Struct, gc=False):
    """A slot's record: a batch and its generation, in the fields' order (encoded in 0.35
    against 0.65 µs as a dict by orjson, the same bytes: test_context.py's golden file)."""

    seq_from: int
    seq_to: int
    text: str
    generation: int


def slot_key(session_id: str, slot: int) -> str:
    return batch_key(session_id, f"s{slot}")


_encode = msgspec.json.Encoder().encode


class Appended(NamedTuple):
    """What ``append`` stored: how many operations, their slots' keys and records, and the
    ages of their emission, ingestion (where known) and newest action (where known)."""

    stored: int
    keys: list[str]
    records: list[bytes]
    ages: tuple[list[float], list[float], list[float]]


class _Head:
    __slots__ = ("actions_to", "appended", "generation", "slot", "used")

    def __init__(self, generation: int, actions_to: int, slot: int, used: int) -> None:
        self.generation, self.actions_to, self.slot, self.used = generation, actions_to, slot, used
        self.appended: list[tuple[int, int, str]] = []


class Heads:
    """The heads, in Python: ``native.Appends``'s methods, for where it is not built."""

    def __init__(self) -> None:
        self._heads: dict[str, _Head] = {}

    def arm(self, session_id: str, generation: int, actions_to: int, slot: int, used: int) -> None:
        """The session's cached context may take appends: its head, nothing appended yet."""
        self._heads[session_id] = _Head(generation, actions_to, slot, used)

    def disarm(self, session_id: str) -> None:
        self._heads.pop(session_id, None)

    def clear(self) -> None:
        self._heads.clear()

    def __len__(self) -> int:
        return len(self._heads)

    def take(self, session_id: str) -> tuple[list[tuple[int, int, str]], int] | None:
        """The batches appended since the session was armed or last taken, and its slots
        used; None if there are none."""
        head = self._heads.get(session_id)
        if head is None or not head.appended:
            return None
        appended, head.appended = head.appended, []
        return appended, head.used

    def append(self, values: list[bytes | None], start: int, now: float) -> Appended:
        """``values[start:]`` stored while each is a batch that follows its session's last."""
        keys: list[str] = []
        records: list[bytes] = []
        ages: tuple[list[float], list[float], list[float]] = ([], [], [])
        for raw in values[start:]:
            try:
                op: Any = decode_context_message(raw or b"", payload=False, header=True)
            except InvalidMessage:
                break
            if type(op) is not WrittenHeader:
                break
            head = self._heads.get(op.session_id)
            if head is None or op.seq_from != head.actions_to + 1:
                break
            if op.generation != head.generation:
                break
            slot = head.slot
            head.slot, head.used, head.actions_to = slot + 1, max(head.used, slot + 1), op.seq_to
            head.appended.append((op.seq_from, op.seq_to, op.text))
            keys.append(slot_key(op.session_id, slot))
            # compact, as native's are: held until the write-behind's unit is in
            records.append(compact(_encode(Slot(op.seq_from, op.seq_to, op.text, op.generation))))
            ages[0].append(max(now - op.emitted_at, 0.0))
            if op.ingested_at > 0:
                ages[1].append(max(now - op.ingested_at, 0.0))
            if op.acted_at > 0:
                ages[2].append(max(now - op.acted_at, 0.0))
        return Appended(len(keys), keys, records, ages)


def heads(*, compiled: bool = True) -> Any:
    """``native.Appends`` where built and ``compiled`` (``AC_COMPILED``), else :class:`Heads`."""
    return native.Appends() if compiled and native is not None else Heads()
