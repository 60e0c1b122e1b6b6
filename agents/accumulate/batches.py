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


# Keys whose last write this worker remembers, cleared when more: ~the default workload's
# (5,000 sessions, an entry and ~6 slots each). With a RocksDB store ~18 MB at most beside it
# (the memory store holds the same objects); an LRU's upkeep cost more than it saved.
WRITTEN_KEPT = 32_768


class TableBatches:
    """The ``BatchStore`` of the session transitions, over the sessions table.

    Changes are staged until ``commit``: a payload that is dead-lettered after
    its transition ran must leave the store as it was (``discard``). ``commit`` writes
    them around the session's entry in crash-safe order (``streams._faust.commit``).

    ``written`` holds the value of each key this worker wrote last (None: deleted), up to
    ``kept`` keys, then starts again (the compiled run does the same as it records its
    writes, ``native.transition_run``): the compiled transition reads entries and batches
    there without a call through the write-behind and the store (``staged`` it fills
    itself). This worker is the table's only writer while it keeps its partitions, so
    ``current`` lets go of it all when the consumer group's generation changes (a
    partition may come back with another worker's writes; test_write_behind.py, "written").
    """

    def __init__(
        self, table: TableT[str, bytes], writes: WriteBehind, *, kept: int = WRITTEN_KEPT
    ) -> None:
        self._table, self._writes, self.kept = table, writes, kept
        self.staged: dict[str, bytes | None] = {}  # None: taken (delete on commit)
        self.written: dict[str, bytes | None] = {}
        self._generation: int | None = None

    def current(self, generation: int | None) -> None:
        """Called before ``written`` is read: forgotten if ``generation`` is another."""
        if generation != self._generation:
            self.written.clear()
            self._generation = generation

    def put(self, session_id: str, index: int, body: bytes) -> None:
        self.staged[batch_key(session_id, index)] = body

    def take(self, session_id: str, first: int, end: int) -> list[bytes]:
        bodies = []
        for index in range(first, end):
            key = batch_key(session_id, index)
            if self.staged.get(key) is not None:
                # Put by this change and taken at once: never written (the slot keeps
                # what it held, which no saved state still reads).
                bodies.append(cast(bytes, self.staged.pop(key)))
                continue
            body = self._writes.get(self._table, key)
            if body is None:  # a bug, not bad input: the state and the store disagree
                raise RuntimeError(f"session {session_id}: pending batch {index} is missing")
            bodies.append(body)
        return bodies

    def delete(self, session_id: str, end: int) -> None:
        for index in range(end):
            self.staged[batch_key(session_id, index)] = None

    def commit(self, session_id: str, entry: bytes | None, *, exact: bool = False) -> None:
        """The staged batches, the session's ``entry`` (None deletes it) that refers to
        them, then the deletions of what it no longer refers to: a crash keeps a prefix
        (test_session_state.py: test_a_change_is_written_batches_entry_then_deletions).
        ``exact``: the compiled transition made them, with no spare buffer to copy away."""
        writes, table, deleted, written = self._writes, self._table, [], self.written
        for key, body in self.staged.items():
            if body is None:
                deleted.append(key)
            else:
                written[key] = writes.set(table, key, body, exact=exact)
        written[session_id] = writes.set(table, session_id, entry, exact=exact)
        for key in deleted:
            written[key] = writes.set(table, key, None)
        self.staged.clear()
        if len(written) > self.kept:
            written.clear()

    def discard(self) -> None:
        self.staged.clear()
