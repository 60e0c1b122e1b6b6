"""Table declarations: raw-bytes values that each owner encodes compactly.

``use_partitioner=True`` puts each key's changelog record on the partition its
key hashes to, which is the session's partition in every topic (all topics are
keyed by session_id with the same partition count). That also lets timers and
per-session tasks, which run outside a stream event, write to tables.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar, cast

import faust

from streams._faust import rocksdb, stores
from streams._faust.raw_table import KEY_SEPARATOR, RawTable, SessionKeyedTable, session_of
from streams.app import ContextApp
from streams.observe import metrics
from streams.observe.lag import tables_recovered

__all__ = [
    "KEY_SEPARATOR",
    "DecodedEntries",
    "OwnedKeyCount",
    "ScanPacer",
    "batch_key",
    "is_session_key",
    "owned_partitions",
    "session_items",
    "session_keyed_table",
    "session_of",
    "session_table",
]

R = TypeVar("R")
SCAN_YIELD_EVERY = 500  # entries between yields to the event loop while scanning

log = logging.getLogger(__name__)


def batch_key(session_id: str, index: int | str) -> str:
    return f"{session_id}{KEY_SEPARATOR}{index}"


def is_session_key(key: str | bytes) -> bool:
    """Whether ``key`` is a session's own entry, not one of its ``batch_key`` entries."""
    if isinstance(key, bytes):
        return b"\x1f" not in key
    return KEY_SEPARATOR not in key


def session_table(app: ContextApp, name: str) -> faust.Table:
    """A table keyed by session id, raw bytes values."""
    return _declare(app, RawTable, name)


def session_keyed_table(app: ContextApp, name: str) -> faust.Table:
    """A table of session entries (keyed by session id) and their ``batch_key``
    entries, all on the session's partition."""
    return _declare(app, SessionKeyedTable, name)


def _declare(app: ContextApp, cls: type[RawTable], name: str) -> faust.Table:
    table = cls(
        app,
        name=name,
        default=None,
        beacon=app.tables.beacon,
        key_type=str,
        value_type=bytes,
        partitions=app.settings.partitions,
        use_partitioner=True,
        options=_rocksdb_options(app) if app.settings.store.startswith("rocksdb") else None,
    )
    if app.settings.store.startswith("rocksdb"):
        _report_rocksdb_memory(app)
    return app.tables.add(table)  # type: ignore[return-value]


def _report_rocksdb_memory(app: ContextApp) -> None:
    def stores() -> list[Any]:
        return [table.data for table in app.tables.values()]

    def reporter(kind: str) -> Callable[[], float]:
        return lambda: rocksdb.memory_bytes(stores())[kind]

    for kind in rocksdb.MEMORY_KINDS:
        metrics.ROCKSDB_MEMORY.labels(kind).set_function(reporter(kind))


def _rocksdb_options(app: ContextApp) -> dict[str, int]:
    """Bounded memory (``streams._faust.rocksdb``): Faust's defaults are a 2 GiB block
    cache and 3 x 64 MiB write buffers per database (one per table and partition).
    """
    settings = app.settings
    return {
        "write_buffer_size": settings.rocksdb_write_buffer_bytes,
        "max_write_buffer_number": 2,
        "block_cache_size": settings.rocksdb_block_cache_bytes,  # shared by all databases
    }


def owned_partitions(app: faust.App, topic: faust.TopicT) -> set[int]:
    """The partitions of ``topic`` this worker is assigned now (empty while starting).

    An in-memory store keeps entries of partitions revoked since, so timers skip
    keys whose partition is not here (tests/integration/test_reliability.py).
    """
    name = topic.get_topic_name()
    try:
        assigned = app.consumer.assignment()
    except Exception:  # the consumer is not started yet, or being replaced
        return set()
    return {tp.partition for tp in assigned if tp.topic == name}


async def session_items(
    table: faust.Table, partitions: set[int]
) -> AsyncIterator[tuple[str, bytes]]:
    """The session entries of ``table`` on ``partitions``, for timers (``batch_key``
    entries are skipped).

    Timers pass the partitions whose state is current
    (:meth:`streams._faust.batch_source.BatchSource.caught_up`): entries elsewhere are
    stale, kept for partitions another worker owns now (see
    :func:`owned_partitions`), or behind records still to be read.

    A scan of every session must neither stall the worker (it yields to the
    event loop every few hundred entries) nor copy the table: a RocksDB store
    is iterated in place (its iterators read a consistent snapshot while
    writes go on), so memory stays flat in the number of sessions; the
    in-memory store, which a concurrent write would invalidate, is iterated
    over a snapshot of its (already in-memory) entries.
    """
    if not partitions:
        return
    for n, (key, value) in enumerate(stores.scan(cast(Any, table).data), 1):
        if n % SCAN_YIELD_EVERY == 0:
            await asyncio.sleep(0)
        if not is_session_key(key):
            continue
        if isinstance(key, bytes):  # a RocksDB store may hand back raw key bytes
            key = key.decode("utf-8")
        if table.partition_for_key(key) in partitions:
            yield key, value


class ScanPacer:
    """Keeps a timer's full-table scan to a share of the worker's time.

    A scan costs O(sessions): at a few hundred thousand idle sessions a scan
    every few seconds took most of the CPU (``python -m scripts.bench --mode memory``).
    After a scan that took ``t``,
    the next is skipped until ``t * (1 / share - 1)`` has passed, so with many
    sessions idle detection runs less often instead of starving the stream.
    """

    def __init__(self, name: str, share: float = 0.1) -> None:
        self.name, self.share = name, share
        self._next = 0.0

    def due(self) -> bool:
        return time.monotonic() >= self._next

    @contextmanager
    def scanning(self) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            self._next = time.monotonic() + took * (1 / self.share - 1)
            if took > 1.0:
                log.info(
                    "%s: scan took %.1fs; next in %.0fs at the earliest",
                    self.name,
                    took,
                    took * (1 / self.share - 1),
                )


class OwnedKeyCount:
    """How many session entries ``table`` holds on this worker's partitions of
    ``topic``: a gauge (``batch_key`` entries are not counted).

    Counting at scrape time walked the whole table, and cached every key's
    partition: at 300k sessions a scrape took seconds of the event loop and the
    cache ~400 bytes a session (``python -m scripts.bench --mode memory``).
    Here the table's owner reports each key it creates or deletes
    (``changed``), and a partition is counted in full only once per assignment
    generation, when the gauge is first read after recovery. ``pending`` gives
    the writes not yet applied to the store (key, whether it will exist), so
    that full count is exact while the owner's writes are in flight.
    """

    def __init__(
        self,
        app: faust.App,
        table: faust.Table,
        topic: faust.TopicT,
        pending: Callable[[], Iterable[tuple[str, bool]]] = tuple,
    ) -> None:
        self.app, self.table, self.topic, self.pending = app, table, topic, pending
        self._counts: dict[int, int] = {}
        self._generation: int | None = None

    def changed(self, key: str, delta: int) -> None:
        """``delta`` is +1 when the owner creates ``key``, -1 when it deletes it."""
        partition = self._partition(key)
        if partition in self._counts:
            self._counts[partition] += delta

    def __call__(self) -> int:
        if self._generation != self.app.consumer_generation_id:
            self._counts.clear()  # a rebalance: partitions may have moved and come back
            self._generation = self.app.consumer_generation_id
        owned = owned_partitions(self.app, self.topic)
        uncounted = owned - self._counts.keys()
        if uncounted and tables_recovered(self.app):
            self._counts.update(self._count(uncounted))
        return sum(n for p, n in self._counts.items() if p in owned)

    def _partition(self, key: str) -> int:
        return cast(int, self.table.partition_for_key(key))

    def _count(self, partitions: set[int]) -> dict[int, int]:
        store = cast(Any, self.table).data
        counts = stores.count_keys(store, partitions, is_session_key, self._partition)
        for key, will_exist in self.pending():
            if not is_session_key(key):
                continue
            if (partition := self._partition(key)) in counts:
                counts[partition] += will_exist - (stores.read(self.table, key) is not None)
        return counts


class DecodedEntries(Generic[R]):
    """The entries of the keys saved last, each with the bytes it was saved as: a key's next
    read takes its record from here instead of decoding the entry again.

    A record is handed out once (``take``) and only against bytes equal to those it was
    saved as: decoding is a function of the bytes, so whatever the store holds (the very
    object, a store's copy, RocksDB's read) they decode to an equal record. Whoever takes
    it and changes it saves it again, or it is decoded next time. Bounded: the keys saved
    longest ago go first. tests/unit/test_session_state.py proves it.
    """

    def __init__(self, decode: Callable[[bytes], R], limit: int = 10_000) -> None:
        self._decode, self._limit = decode, limit
        # Ordered: a dict's first key, once others were taken out, is found by a walk past
        # their slots (3.6 against 1.0 µs a request with 50,000 sessions; decisions.md).
        self._kept: OrderedDict[str, tuple[bytes, R]] = OrderedDict()

    def take(self, key: str, raw: bytes | None) -> R | None:
        """The record ``raw`` holds: kept if ``raw`` is what it was saved as, else decoded."""
        kept = self._kept.pop(key, None)
        if raw is None:
            return None
        if kept is not None and kept[0] == raw:
            return kept[1]
        return self._decode(raw)

    def keep(self, key: str, raw: bytes, record: R) -> None:
        """``record`` was just saved as ``raw`` and is not changed after."""
        kept = self._kept
        kept[key] = (raw, record)
        if len(kept) > self._limit:
            kept.popitem(last=False)
