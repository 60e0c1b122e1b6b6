"""The accumulator's ``BatchStore`` over the sessions table, and its message-size guard."""

from __future__ import annotations

from typing import cast

from faust.types import TableT

from agents.accumulate.state import Emission
from streams._faust.write_behind import WriteBehind
from streams.tables import batch_key
from streams.topics import MESSAGE_MAX_BYTES

__all__ = ["TableBatches", "oversized"]


def oversized(state: bytes, out: list[Emission]) -> str | None:
    """Why this payload cannot be applied within the broker's message limit, if it cannot.

    The state must stay under half the limit: a debounce flush or an idle close
    later emits what it holds as one operation of up to about twice its size.
    """
    biggest = 0
    for e in out:  # not max() over a generator with default=: ~1 µs a payload
        biggest = max(biggest, len(e.value))
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


class TableBatches:
    """The ``BatchStore`` of the session transitions, over the sessions table.

    Changes are staged until ``commit``: a payload that is dead-lettered after
    its transition ran must leave the store as it was (``discard``). ``commit`` writes
    them around the session's entry in crash-safe order (``streams._faust.commit``).
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
                # Put by this change and taken at once: never written (the slot keeps
                # what it held, which no saved state still reads).
                bodies.append(cast(bytes, self._staged.pop(key)))
                continue
            body = self._writes.get(self._table, key)
            if body is None:  # a bug, not bad input: the state and the store disagree
                raise RuntimeError(f"session {session_id}: pending batch {index} is missing")
            bodies.append(body)
        return bodies

    def delete(self, session_id: str, end: int) -> None:
        for index in range(end):
            self._staged[batch_key(session_id, index)] = None

    def commit(self, session_id: str, entry: bytes | None, *, exact: bool = False) -> None:
        """The staged batches, the session's ``entry`` (None deletes it) that refers to
        them, then the deletions of what it no longer refers to: a crash keeps a prefix
        (test_session_state.py: test_a_change_is_written_batches_entry_then_deletions).
        ``exact``: the compiled transition made them, with no spare buffer to copy away."""
        writes, table, deleted = self._writes, self._table, []
        for key, body in self._staged.items():
            if body is None:
                deleted.append(key)
            else:
                writes.set(table, key, body, exact=exact)
        writes.set(table, session_id, entry, exact=exact)
        for key in deleted:
            writes.set(table, key, None)
        self._staged.clear()

    def discard(self) -> None:
        self._staged.clear()
