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
(:meth:`Commits.commit`, steps 3-5 shared by the messages whose outputs are in at
once); the accumulator pipelines them over units (``WriteBehind``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from faust.types import TableT

from streams._faust import changelog, stores

__all__ = ["Commits", "Write", "outputs_acknowledged"]

Write = tuple[TableT[str, bytes], str, "bytes | None"]  # table, key, value (None deletes)


async def outputs_acknowledged(acks: Iterable[Awaitable[Any]]) -> None:
    """Steps 1 and 2: wait for the broker's acknowledgements (records appended in one
    round share one)."""
    for ack in dict.fromkeys(acks):
        await ack


class Commits:
    """Steps 1 to 5 for each input of a stage's lanes, which finish one at a time.

    Lanes whose outputs the same broker round acknowledged resume in one turn of the
    event loop; their steps 3 to 5 are taken once for all of them, at the end of that
    turn: one changelog append and one confirmation instead of one each (the summarize
    stage's per-request commit was 4.2% of a pipeline worker by py-spy). Each input is
    acknowledged only after that append is confirmed (tests/unit/test_commits.py).
    """

    def __init__(self, app: Any) -> None:
        self._app = app
        self._due: list[tuple[Sequence[Write], Callable[[], Awaitable[Any]]]] = []
        self._done: asyncio.Future[None] | None = None  # the due inputs' steps 3-5
        self._running: set[asyncio.Task[None]] = set()  # held: the loop keeps weak references

    async def commit(
        self,
        acknowledge: Callable[[], Awaitable[Any]],
        *,
        outputs: Iterable[Awaitable[Any]] = (),
        writes: Sequence[Write] = (),
    ) -> None:
        """Steps 1 to 5 for one input (``outputs`` needing no order: no step 2);
        ``acknowledge`` runs once its work is durable, and this returns after it."""
        await outputs_acknowledged(outputs)
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(self._start)
        self._due.append((writes, acknowledge))
        await asyncio.shield(self._done)  # one lane's cancellation leaves the others' steps

    def _start(self) -> None:
        due, done, self._due, self._done = self._due, self._done, [], None
        assert done is not None
        task = asyncio.create_task(self._durable(due), name="commits")
        self._running.add(task)
        task.add_done_callback(self._running.discard)
        task.add_done_callback(lambda t: _settle(done, t))

    async def _durable(self, due: list[tuple[Sequence[Write], Any]]) -> None:
        """Steps 3 to 5 for ``due``, in the order their lanes got there."""
        compacted = [
            (table, key, stores.compact(value)) for writes, _ in due for table, key, value in writes
        ]
        await changelog.confirm(changelog.write_all(self._app, compacted))  # steps 3 and 4
        for _, acknowledge in due:
            await acknowledge()


def _settle(done: asyncio.Future[None], task: asyncio.Task[None]) -> None:
    if done.cancelled():
        return
    if task.cancelled():
        done.cancel()
    elif (error := task.exception()) is not None:
        done.set_exception(error)
    else:
        done.set_result(None)
