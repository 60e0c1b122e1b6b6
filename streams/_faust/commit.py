"""The commit protocol: how a stage makes its work for an input durable before Faust
may commit the input's offset. Written once; every stage uses it.

1. Output acknowledged: the broker has the messages the input caused (for a sink,
   the destination has applied the operation).
2. Ordered output acknowledged: the messages that must not overtake those of step 1
   (a summarize request, after the batches it covers: ``chaos.py --cluster``,
   tests/unit/test_write_behind.py) are produced only now, and acknowledged before
   anything is logged.
3. Table writes logged in the order they were made, which each writer makes
   crash-safe: new entries, then the entry that refers to them, then deletions of
   what nothing refers to (``TableBatches.commit``, ``ContextStore.save``). A
   session's records share one changelog partition, where a crash loses only a
   suffix, so whatever survives is a state the writer went through.
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

__all__ = ["Write", "commit", "outputs_acknowledged"]

Write = tuple[TableT[str, bytes], str, "bytes | None"]  # table, key, value (None deletes)


async def outputs_acknowledged(acks: Iterable[Awaitable[Any]]) -> None:
    """Steps 1 and 2: wait for the broker's acknowledgements (records appended in one
    round share one)."""
    for ack in dict.fromkeys(acks):
        await ack


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
    await changelog.confirm(changelog.write_all(app, compacted))  # steps 3 and 4
    await acknowledge()
