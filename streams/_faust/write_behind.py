"""Table writes that wait for the messages they account for, without stalling the stream.

An agent that emits messages and records in a table that it did (the input
offset it applied, the sequence numbers it used) must not let the table entry
become durable before the messages are: after a crash the entry would say
"done" for output that never reached the broker. The simple way, awaiting the
broker's acknowledgement before every table write, stalls the agent for a
round trip per batch. Here the agent goes on with the next batch at once:

- reads see the newest value (an overlay holds writes not yet applied);
- each sealed unit (messages, table writes, input records to acknowledge) goes
  through the commit protocol's steps (``streams._faust.commit``) in two pipelined
  stages: steps 1-2 (its messages acknowledged, then the ones sent ``after_previous``
  produced and acknowledged), after which its writes join the open *checkpoint*;
  a checkpoint is logged (step 3) once it is ``checkpoint_s`` old, and then its
  changelog records and inputs are acknowledged (steps 4-5).

A checkpoint holds each key's last write only, so a session written by several
payloads within it costs one changelog record, and a batch entry written and
deleted within it none (as Kafka Streams' ``commit.interval.ms`` and Quix Streams'
checkpoints do). A crash replays at most a checkpoint's inputs against the last
durable state; what they re-emit carries the same sequence numbers, which
consumers skip.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import operator
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from faust.types import TableT

from streams._faust import changelog, stores
from streams._faust.changelog import Written
from streams._faust.commit import Rank, log_writes, outputs_acknowledged, session_rank
from streams.app import ContextApp

__all__ = ["WriteBehind"]

log = logging.getLogger(__name__)


_Write = tuple[TableT[str, bytes], str, "bytes | None", int]  # table, key, value, version
_Slot = tuple[int, str]  # id(table), key

# A checkpoint is logged early past this many writes and inputs: the memory it holds
# (the overlay's values, the input records) stays bounded whatever the interval.
CHECKPOINT_MAX_ITEMS = 50_000


@dataclass
class _Unit:
    acks: list[Awaitable[Any]] = field(default_factory=list)  # broker acknowledgements
    deferred: list[tuple[str, bytes, bytes]] = field(default_factory=list)  # after the acks
    writes: list[_Write] = field(default_factory=list)
    inputs: list[tuple[Any, Any]] = field(default_factory=list)  # (source, record) to ack


@dataclass
class _Checkpoint:
    """Units' writes merged (each key's last, with its rank) and inputs, until logged."""

    opened: float = 0.0
    writes: dict[_Slot, tuple[_Write, int]] = field(default_factory=dict)
    own: list[_Write] | None = None  # a unit logged alone, every write in its own order
    inputs: list[tuple[Any, Any]] = field(default_factory=list)
    logged: list[_Slot] = field(default_factory=list)  # the keys of its changelog records
    changelog: Written = field(default_factory=list)  # records to confirm

    def __len__(self) -> int:
        return len(self.writes) + len(self.inputs)


class WriteBehind:
    """Ordered, pipelined "emit, then record" for one agent's tables.

    ``max_units`` bounds how many sealed units, and logged checkpoints, may wait for
    the broker: sealing one more waits for room, which back-pressures the stream.
    ``checkpoint_s``: how long writes gather before they are logged (0: at once).
    """

    def __init__(
        self,
        app: ContextApp,
        *,
        max_units: int = 32,
        checkpoint_s: float = 0.0,
        on_error: Callable[[str, BaseException], Awaitable[None]],
        order_of: Rank = session_rank,
    ) -> None:
        self._app = app
        self._on_error = on_error
        self._order_of = order_of
        self._checkpoint_s = checkpoint_s
        self._overlay: dict[_Slot, tuple[bytes | None, int]] = {}
        self._version = 0
        self._unit = _Unit()
        self._open = _Checkpoint()
        self._in_flight: collections.Counter[_Slot] = collections.Counter()  # logged, unconfirmed
        self._due_now = False  # revoked partitions: log the open checkpoint at once
        self._queue: asyncio.Queue[_Unit] = asyncio.Queue(maxsize=max_units)
        self._logged: asyncio.Queue[_Checkpoint] = asyncio.Queue(maxsize=max_units)
        self._tasks: list[asyncio.Task[None]] = []
        app.flow_control.manage_queue(self)  # type: ignore[arg-type]  # clear() on revocation

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

    def set(self, table: TableT[str, bytes], key: str, value: bytes | None) -> None:
        """Record a write (``None`` deletes); visible to ``get`` at once, applied on completion."""
        self._version += 1
        if value is not None:
            # Held until the unit completes: a compact copy, not orjson's ~4 KiB buffer
            # (python -m scripts.bench --mode accumulate reports the peak RSS).
            value = stores.compact(value)
        self._overlay[(id(table), key)] = (value, self._version)
        self._unit.writes.append((table, key, value, self._version))

    async def send(
        self, topic: str, key: str, value: bytes, *, after_previous: bool = False
    ) -> None:
        """Produce (appended per partition); the unit completes when the broker has it.

        ``after_previous``: produced only once the broker has this unit's (and every
        earlier unit's) other messages, e.g. a summarize request after its batches."""
        if after_previous:
            self._unit.deferred.append((topic, key.encode(), value))
        else:
            self._unit.acks.append(await self._app.append(topic, key.encode(), value))

    def track(self, source: Any, record: Any) -> None:
        """``source.ack_all`` the unit's records, in order, when the current unit completes
        (a ``BatchSource`` and its message)."""
        self._unit.inputs.append((source, record))

    def clear(self) -> None:
        """Faust's flow control on revocation: the records taken must be acknowledged
        before the rebalance goes on, so the open checkpoint is logged now."""
        self._due_now = True
        if self._queue.empty():
            self._queue.put_nowait(_Unit())  # wakes the stage waiting for units

    async def seal(self) -> None:
        """End the current unit: its writes and acks happen after its messages are acked."""
        unit, self._unit = self._unit, _Unit()
        if not (unit.acks or unit.deferred or unit.writes or unit.inputs):
            return
        if not self._tasks or any(t.done() for t in self._tasks):
            self._tasks = [
                asyncio.create_task(self._guarded(self._record), name="wb-record"),
                asyncio.create_task(self._guarded(self._acknowledge), name="wb-ack"),
            ]
        await self._queue.put(unit)

    async def _guarded(self, stage: Callable[[], Awaitable[None]]) -> None:
        try:
            await stage()
        except Exception as exc:
            # Messages or changelog records not acknowledged: nothing of these units
            # or after them may be recorded or committed. Stop the worker; the
            # unacknowledged input is replayed on restart.
            await self._on_error("write-behind", exc)

    async def _units(self) -> list[_Unit]:
        """Every unit sealed meanwhile (one step for all: a unit's deferred messages cost a
        round trip, tests/unit/test_write_behind.py, "drains"); none once the open
        checkpoint is due."""
        queue, opened = self._queue, self._open
        if not (opened.writes or opened.inputs):
            units = [await queue.get()]
        else:
            wait = opened.opened + self._checkpoint_s - time.monotonic()
            if wait <= 0 or self._due_now:
                return []
            try:
                units = [await asyncio.wait_for(queue.get(), wait)]
            except TimeoutError:
                return []
        while not queue.empty():
            units.append(queue.get_nowait())
        for _ in units:
            queue.task_done()
        return units

    async def _record(self) -> None:
        """Steps 1 to 3 of the commit protocol (``streams._faust.commit``), for the units
        in order: each unit's deferred messages produced once its (and every earlier
        unit's) messages are acknowledged, all of them acknowledged before any of the
        units' writes joins the checkpoint, which is logged when it is due."""
        append = self._app.append
        while True:
            units, deferred = await self._units(), []
            for unit in units:
                await outputs_acknowledged(unit.acks)
                deferred += [await append(*record) for record in unit.deferred]
            # Before the changelog: a request lost after its unit is logged would never be
            # replayed (tests/unit/test_write_behind.py, "deferred").
            await outputs_acknowledged(deferred)
            for unit in units:
                if not self._merge(unit):  # a key written back to an earlier rank: alone
                    await self._log()
                    self._open = _Checkpoint(own=unit.writes, inputs=unit.inputs)
                    await self._log()
            opened = self._open
            if (opened.writes or opened.inputs) and (
                not units  # due: _units waited for it
                or len(opened) >= CHECKPOINT_MAX_ITEMS
                or time.monotonic() >= opened.opened + self._checkpoint_s
            ):
                await self._log()

    def _merge(self, unit: _Unit) -> bool:
        """Add ``unit`` to the open checkpoint, unless one of its keys would be written
        back to an earlier rank (a batch entry deleted, then written anew): merged, its
        last write would move before the first, so such a unit is logged alone, in its
        own order (``crash_safe_order``; test_write_behind.py, "alone")."""
        opened, rank = self._open, self._order_of
        ranked: list[tuple[_Slot, _Write, int]] = []
        last: dict[_Slot, int] = {}
        for write in unit.writes:
            slot, position = (id(write[0]), write[1]), rank(write[1], write[2])
            seen = last.get(slot)
            if seen is None and (merged := opened.writes.get(slot)) is not None:
                seen = merged[1]
            if seen is not None and seen > position:
                return False
            last[slot] = position
            ranked.append((slot, write, position))
        if not (opened.writes or opened.inputs):
            opened.opened = time.monotonic()
        writes = opened.writes
        for slot, write, position in ranked:
            writes[slot] = (write, position)
        opened.inputs += unit.inputs
        return True

    async def _log(self) -> None:
        """Step 3 for the open checkpoint: its writes' changelog records, in crash-safe
        order; a deletion of a key that neither the store nor a record in flight holds
        (written and deleted within the checkpoint) needs none."""
        done, self._open, self._due_now = self._open, _Checkpoint(), False
        in_flight, records = self._in_flight, []
        if done.own is not None:
            records = done.own
            done.logged = [(id(w[0]), w[1]) for w in records]
            done.writes = {slot: (w, 0) for slot, w in zip(done.logged, records, strict=True)}
        else:
            for slot, (write, _) in done.writes.items():
                table, key, value = write[0], write[1], write[2]
                if value is None and not in_flight[slot] and stores.read(table, key) is None:
                    continue
                records.append(write)
                done.logged.append(slot)
        if not (records or done.inputs):
            return
        in_flight.update(done.logged)
        done.changelog = log_writes(self._app, records, self._order_of)
        await self._logged.put(done)

    async def _acknowledge(self) -> None:
        """Steps 4 and 5, checkpoint by checkpoint: its changelog records are in (and so in
        the store); the overlay lets go of what the table now holds, and its inputs are
        acknowledged."""
        overlay, in_flight = self._overlay, self._in_flight
        while True:
            done = await self._logged.get()
            await changelog.confirm(done.changelog)
            in_flight.subtract(done.logged)
            for slot in done.logged:
                if in_flight[slot] <= 0:
                    del in_flight[slot]
            for slot, ((_, _, _, version), _) in done.writes.items():
                if overlay.get(slot, (None, -1))[1] == version:
                    del overlay[slot]  # no newer write is waiting: the table is current
            for source, records in itertools.groupby(done.inputs, key=operator.itemgetter(0)):
                source.ack_all([record for _, record in records])
            self._logged.task_done()
