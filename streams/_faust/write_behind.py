"""Table writes that wait for the messages they account for, without stalling the stream.

An agent that emits messages and records in a table that it did (the input
offset it applied, the sequence numbers it used) must not let the table entry
become durable before the messages are: after a crash the entry would say
"done" for output that never reached the broker. The simple way, awaiting the
broker's acknowledgement before every table write, stalls the agent for a
round trip per batch. Here the agent goes on with the next batch at once:

- reads see the newest value (an overlay holds writes not yet applied);
- each sealed unit (messages, table writes, input records to acknowledge) is
  completed in order, through the commit protocol's steps (``streams._faust.commit``)
  in two pipelined stages: steps 1-3 (its messages acknowledged, then the ones sent
  ``after_previous`` produced and acknowledged, its table writes logged) and steps
  4-5 (its changelog records acknowledged, its input acknowledged).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import repeat
from typing import Any

from faust.types import TableT

from streams._faust import changelog, stores
from streams._faust.changelog import Written
from streams._faust.commit import outputs_acknowledged
from streams.app import ContextApp
from streams.observe import metrics

__all__ = ["WriteBehind"]

log = logging.getLogger(__name__)


_Write = tuple[TableT[str, bytes], str, "bytes | None", int]  # table, key, value, version


@dataclass
class _Unit:
    acks: list[Awaitable[Any]] = field(default_factory=list)  # broker acknowledgements
    deferred: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # after the acks
    writes: list[_Write] = field(default_factory=list)
    inputs: list[tuple[Any, Any]] = field(default_factory=list)  # (source, record) to ack
    changelog: Written = field(default_factory=list)  # records to confirm


class WriteBehind:
    """Ordered, pipelined "emit, then record" for one agent's tables.

    ``max_units`` bounds how many sealed units may wait for the broker: sealing
    one more waits for room, which back-pressures the stream; ``stage`` names the
    waits' counter (``ac_write_behind_wait_seconds_total``).
    """

    def __init__(
        self,
        app: ContextApp,
        *,
        max_units: int = 32,
        stage: str = "",
        on_error: Callable[[str, BaseException], Awaitable[None]],
    ) -> None:
        self._app = app
        self._waits = metrics.WRITE_BEHIND_WAITS.labels(stage)
        self._on_error = on_error
        self._overlay: dict[tuple[int, str], tuple[bytes | None, int]] = {}
        self._version = 0
        self._unit = _Unit()
        self._queue: asyncio.Queue[_Unit] = asyncio.Queue(maxsize=max_units)
        self._recorded: asyncio.Queue[_Unit] = asyncio.Queue(maxsize=max_units)
        self._tasks: list[asyncio.Task[None]] = []

    def get(self, table: TableT[str, bytes], key: str) -> bytes | None:
        hit = self._overlay.get((id(table), key))
        if hit is not None:
            return hit[0]
        return stores.read(table, key)

    def pending(self, table: TableT[str, bytes]) -> Iterator[tuple[str, bool]]:
        """``table``'s writes not applied yet: (key, whether it exists afterwards)."""
        for (table_id, key), (value, _) in list(self._overlay.items()):
            if table_id == id(table):
                yield key, value is not None

    def set(
        self, table: TableT[str, bytes], key: str, value: bytes | None, *, exact: bool = False
    ) -> bytes | None:
        """Record a write (``None`` deletes); visible to ``get`` at once, applied on completion.
        ``exact``: ``value`` holds no spare buffer (``native/`` made it), kept as it is.
        Returns the value as held."""
        self._version += 1
        if value is not None and not exact:
            # Held until the unit completes: a compact copy, not orjson's ~4 KiB buffer
            # (python -m scripts.bench --mode accumulate reports the peak RSS).
            value = stores.compact(value)
        self._overlay[(id(table), key)] = (value, self._version)
        self._unit.writes.append((table, key, value, self._version))
        return value

    def set_all(self, table: TableT[str, bytes], keys: list[str], values: list[bytes]) -> None:
        """``set(table, key, value, exact=True)`` for each pair, in order, under one version:
        a key set twice holds the later value, and both writes go in the same unit."""
        self._version += 1
        version, table_id = self._version, id(table)
        pairs = zip(zip(repeat(table_id), keys), zip(values, repeat(version)), strict=True)
        self._overlay.update(pairs)
        self._unit.writes.extend(zip(repeat(table), keys, values, repeat(version)))

    async def send(
        self, topic: str, key: str, value: bytes, *, after_previous: bool = False
    ) -> None:
        """Produce (appended per partition); the unit completes when the broker has it.

        ``after_previous``: produced only once the broker has this unit's (and every
        earlier unit's) other messages, e.g. a summarize request after its batches."""
        await self.send_all([(topic, key, value, after_previous)])

    async def send_all(self, records: Iterable[tuple[str, str, bytes, bool]]) -> None:
        """``send`` each (topic, key, value, after_previous) in order: appended without a
        coroutine each, awaited only while the producer has no metadata for the topic."""
        append_keyed = self._app.appender.append_keyed
        for topic, key, value, after_previous in records:
            if after_previous:
                self._unit.deferred.append((topic, key.encode(), value))
            elif (acked := append_keyed(topic, key.encode(), value)) is not None:
                self._unit.acks.append(acked)
            else:
                self._unit.acks.append(await self._app.append(topic, key.encode(), value))

    async def send_runs(
        self, topic: str, runs: list[tuple[int, list[tuple[bytes, bytes | None]]]]
    ) -> None:
        """``send`` each record of ``runs``, (partition, [(key, value), ...]) in order: one
        append per partition (``Appender.append_run``); partition -1: the producer has no
        metadata for ``topic`` yet, each record awaited as ``send_all`` awaits it."""
        append_run, acks = self._app.appender.append_run, self._unit.acks
        for partition, records in runs:
            if partition >= 0:
                acks.append(append_run(topic, partition, records))
                continue
            for key, value in records:
                acks.append(await self._app.append(topic, key, value))

    def run_compiled(self, run: Callable[..., tuple[Any, ...]], table: Any, *args: Any) -> Any:
        """``run(overlay, writes, deferred, table, id(table), version, *args)``: a compiled
        writer (``native.transition_run``) records ``set(table, ..., exact=True)`` and
        ``send(..., after_previous=True)`` as they do, in order; it returns the version
        after its writes first (tests/unit/test_accumulate_run.py)."""
        unit = self._unit
        done = run(
            self._overlay, unit.writes, unit.deferred, table, id(table), self._version, *args
        )
        self._version = done[0]
        return done

    def track(self, source: Any, record: Any) -> None:
        """``source.ack_all`` the unit's records, in order, when the current unit completes
        (a ``BatchSource`` and its message)."""
        self._unit.inputs.append((source, record))

    def track_all(self, source: Any, records: list[Any]) -> None:
        """``track`` each of ``records``, in order."""
        self._unit.inputs.extend(zip(repeat(source), records))

    async def seal(self) -> None:
        """End the current unit: its writes and acks happen after its messages are acked.

        One task seals at a time (the accumulator's state lock, an inline sink's lock):
        ``Queue.put`` is not first come, first served, so concurrent sealers waiting for
        room could queue their units out of order (found in session 27's trial of lanes)."""
        unit, self._unit = self._unit, _Unit()
        if not (unit.acks or unit.deferred or unit.writes or unit.inputs):
            return
        if not self._tasks or any(t.done() for t in self._tasks):
            self._tasks = [
                asyncio.create_task(self._stage(self._queue, self._record), name="wb-record"),
                asyncio.create_task(self._stage(self._recorded, self._acknowledge), name="wb-ack"),
            ]
        if not self._queue.full():
            self._queue.put_nowait(unit)
            return
        # Full: the broker's acknowledgements are the bound now, not this stage's CPU
        # (test_write_behind.py, "waits"; python -m scripts.bench prints the share).
        started = time.perf_counter()
        await self._queue.put(unit)
        self._waits.inc(time.perf_counter() - started)

    async def _stage(
        self, queue: asyncio.Queue[_Unit], step: Callable[[list[_Unit]], Awaitable[None]]
    ) -> None:
        while True:
            # Every unit sealed meanwhile, in one step: a unit's deferred messages cost a
            # round trip, so one step per unit capped the units per second (small units
            # fell behind; tests/unit/test_write_behind.py, "drains").
            units = [await queue.get()]
            while not queue.empty():
                units.append(queue.get_nowait())
            try:
                await step(units)
            except Exception as exc:
                # Messages or changelog records not acknowledged: nothing of these
                # units or after them may be recorded or committed. Stop the worker;
                # the unacknowledged input is replayed on restart.
                await self._on_error("write-behind", exc)
                return
            finally:
                for _ in units:
                    queue.task_done()

    async def _record(self, units: list[_Unit]) -> None:
        """Steps 1 to 3 of the commit protocol (``streams._faust.commit``), for the units
        in order: each unit's deferred messages produced once its (and every earlier
        unit's) messages are acknowledged, all of them acknowledged before any of the
        units' table writes is logged."""
        append, deferred = self._app.append, []
        for unit in units:
            await outputs_acknowledged(unit.acks)
            deferred += [await append(*record) for record in unit.deferred]
        # Before the changelog: a request lost after its unit is logged would never be
        # replayed (tests/unit/test_write_behind.py, "deferred").
        await outputs_acknowledged(deferred)
        for unit in units:
            # Needed only for the input's ack: they ride with the next outputs' round.
            unit.changelog = changelog.write_all(self._app, unit.writes, may_wait=True)
            await self._recorded.put(unit)

    async def _acknowledge(self, units: list[_Unit]) -> None:
        """Steps 4 and 5, unit by unit: the changelog records are in (and so in the store);
        the overlay lets go of what the table now holds, and the unit's input is acknowledged."""
        for unit in units:
            await changelog.confirm(unit.changelog)
            for table, key, _, version in unit.writes:
                slot = (id(table), key)
                if self._overlay.get(slot, (None, -1))[1] == version:
                    del self._overlay[slot]  # no newer write is waiting: the table is current
            for source, records in itertools.groupby(unit.inputs, key=operator.itemgetter(0)):
                source.ack_all([record for _, record in records])
