"""The commit protocol: how a stage makes its work for an input durable before Faust
may commit the input's offset. Written once; every stage uses it.

1. Output acknowledged: the broker has the messages the input caused (for a sink,
   the destination has applied the operation).
2. Ordered output acknowledged: the messages that must not overtake those of step 1
   (a summarize request, after the batches it covers: ``chaos.py --cluster``,
   tests/unit/test_write_behind.py) are produced only now, and acknowledged before
   anything is logged.
3. Table writes logged in crash-safe order (:func:`crash_safe_order`): new entries,
   then the entry that refers to them, then deletions of what nothing refers to. A
   session's records share one changelog partition, where a crash loses only a
   suffix, so whatever survives is consistent.
4. Changelog acknowledged: the broker has those records, and only then does the
   store apply them (``changelog.write``): the store stays a prefix of the changelog.
5. Input acknowledged, in offset order (``InOrderAcks``, ``BatchSource.ack``): only
   now may Faust commit past it.

A crash between two steps replays the unacknowledged input against the last durable
state; the output it re-emits carries the same sequence numbers, which consumers
skip. The summarizer and the sink runner take these steps per message
(:func:`commit`); the accumulator pipelines them over units (``WriteBehind``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from faust.types import TableT

from streams._faust import changelog, stores
from streams._faust.changelog import Written
from streams._faust.raw_table import KEY_SEPARATOR

__all__ = ["Write", "commit", "crash_safe_order", "log_writes", "outputs_acknowledged"]

Write = tuple[TableT[str, bytes], str, "bytes | None"]  # table, key, value (None deletes)
Rank = Callable[[str, "bytes | None"], int]


def session_rank(key: str, value: bytes | None) -> int:
    """A session-keyed table's order: its batch entries, the session entry that refers
    to them, then deletions of batch entries (tests/integration/test_pipeline.py, kill -9)."""
    if KEY_SEPARATOR in key:
        return 0 if value is not None else 2
    return 1


def crash_safe_order(writes: Sequence[Any], rank: Rank = session_rank) -> Sequence[Any]:
    """``writes`` (tuples starting ``table, key, value``) sorted by ``rank``, stable.

    A unit's writes are not atomic: ranked so that any prefix is consistent, and
    kept on one changelog partition (a session-keyed table), a crash loses only a
    suffix and no write waits for another's acknowledgement. If a key's later write
    would move before an earlier one (a deletion, then a new value), the writes keep
    their own order.
    """
    by_rank: dict[int, list[Any]] = {}  # ranks are few: buckets, not a sort
    last_rank: dict[tuple[int, str], int] = {}
    for write in writes:
        table, key, value = write[0], write[1], write[2]
        position = rank(key, value)
        if last_rank.setdefault((id(table), key), position) > position:
            return writes  # reordering would swap this key's writes
        last_rank[(id(table), key)] = position
        by_rank.setdefault(position, []).append(write)
    if len(by_rank) <= 1:
        return writes
    return [write for position in sorted(by_rank) for write in by_rank[position]]


async def outputs_acknowledged(acks: Iterable[Awaitable[Any]]) -> None:
    """Steps 1 and 2: wait for the broker's acknowledgements (records appended in one
    round share one)."""
    for ack in dict.fromkeys(acks):
        await ack


def log_writes(app: Any, writes: Sequence[Any], rank: Rank | None = session_rank) -> Written:
    """Step 3: produce ``writes``' changelog records in crash-safe order (``rank`` None:
    they are in it, made so by their writer, e.g. ``sinks.context_store``)."""
    return changelog.write_all(app, writes if rank is None else crash_safe_order(writes, rank))


async def commit(
    app: Any,
    acknowledge: Callable[[], Awaitable[Any]],
    *,
    outputs: Iterable[Awaitable[Any]] = (),
    writes: Sequence[Write] = (),
) -> None:
    """Steps 1 to 5 for one input (``outputs`` needing no order: no step 2);
    ``acknowledge`` runs once its work is durable."""
    await outputs_acknowledged(outputs)
    compacted = [(table, key, stores.compact(value)) for table, key, value in writes]
    await changelog.confirm(log_writes(app, compacted))  # steps 3 and 4
    await acknowledge()
