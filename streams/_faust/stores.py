"""The one adapter over Faust's table stores (in memory or RocksDB).

What the workers need from a store, whatever its kind: a read that goes to the
key's own partition, a write of an acknowledged changelog record, a scan, a count
per partition, and the RocksDB databases for memory figures. The type of a store
is tested here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast, overload

from faust.stores.memory import Store as MemoryStore
from faust.stores.rocksdb import Store as RocksDBStore
from faust.types import TableT

__all__ = ["count_keys", "databases", "is_rocksdb", "put", "read", "scan"]


# A store's kind by its type: the stores are ABCs, whose isinstance was 0.3 µs a read
# (~0.6% of the pipeline worker by py-spy, docs/performance.md).
_ROCKSDB, _MEMORY, _OTHER = 1, 2, 0
_KINDS: dict[type, int] = {}


def _kind(store: Any) -> int:
    kind = _KINDS.get(type(store))
    if kind is None:
        kind = _KINDS[type(store)] = (
            _ROCKSDB
            if isinstance(store, RocksDBStore)
            else _MEMORY
            if isinstance(store, MemoryStore)
            else _OTHER
        )
    return kind


def is_rocksdb(store: Any) -> bool:
    return _kind(store) == _ROCKSDB


def read(table: TableT[str, bytes], key: str) -> bytes | None:
    """``table.get(key)``, straight from the key's partition for a RocksDB store.

    Faust's RocksDB lookup of a key missing from its small LRU index probes
    every partition database in turn; with hundreds of thousands of sessions
    nearly every lookup missed (the memory benchmark ran 4x slower).
    """
    store = cast(Any, table).data
    kind = _kind(store)
    if kind == _ROCKSDB:
        partition = cast(int, table.partition_for_key(key))
        try:
            db = store._dbs[partition]
        except KeyError:  # not opened yet: nothing written there by this worker
            return cast(bytes | None, table.get(key))
        return cast(bytes | None, db.get(key.encode()))
    if kind == _MEMORY:
        return cast(bytes | None, store.data.get(key))  # its dict, without Table.get's hooks
    return cast(bytes | None, table.get(key))


@overload
def compact(value: bytes) -> bytes: ...
@overload
def compact(value: None) -> None: ...
def compact(value: bytes | None) -> bytes | None:
    """A copy holding only its bytes: orjson's ``dumps`` result keeps a ~4 KiB buffer per
    entry (``--mode memory`` measures the RSS per session). Values are compacted where they
    are first held: ``WriteBehind.set``, ``commit.commit`` and the summarize stage's kept
    state (which ``commit`` copies once more: 0.1 µs for its ~1 KB, once per request)."""
    return None if value is None else memoryview(value).tobytes()


def put(store: Any, entries: Iterable[tuple[str, bytes | None]], partition: int) -> None:
    """Apply changelog records of ``partition`` the broker has acknowledged, in order
    (``None`` deletes); each value is stored as given, the very object the write-behind's
    readers saw (DecodedEntries)."""
    kind = _kind(store)
    if kind == _ROCKSDB:
        # Faust's RocksDB ``_set`` writes into the database of the *current
        # event's* partition (and asserts there is one): wrong for a timer, a
        # lane task, or a batch holding several partitions' events. Write into
        # the key's own partition database, as recovery would, and as its
        # ``apply_changelog_batch`` does: one WriteBatch, without its key index (a put
        # per record was 10% of a RocksDB pipeline; test_rocksdb_store.py).
        from rocksdict import WriteBatch  # the rocksdb extra (streams/_faust/rocksdb.py)

        batch = WriteBatch(raw_mode=True)
        for key, value in entries:
            if value is None:
                batch.delete(key.encode())
            else:
                batch.put(key.encode(), value)
        if len(batch):
            store._db_for_partition(partition).write(batch)
        return
    data = store.data if kind == _MEMORY else store  # its dict, as ``read``
    for key, value in entries:
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value


def scan(store: Any) -> Iterable[tuple[str | bytes, bytes]]:
    """Every entry: a RocksDB store iterated in place (its iterators read a consistent
    snapshot while writes go on), the in-memory one over a snapshot of its entries
    (a concurrent write would invalidate its iterator)."""
    return cast(
        Iterable[tuple[str | bytes, bytes]],
        store.items() if is_rocksdb(store) else list(store.items()),
    )


def count_keys(
    store: Any,
    partitions: set[int],
    counted: Callable[[Any], bool],
    partition_of: Callable[[str], int],
) -> dict[int, int]:
    """How many keys on each of ``partitions`` pass ``counted``: a RocksDB store counts
    each partition's own database, the in-memory one walks its keys once."""
    counts = dict.fromkeys(partitions, 0)
    if is_rocksdb(store):
        for partition in partitions:
            db = store._dbs.get(partition)
            counts[partition] = 0 if db is None else sum(map(counted, db.keys()))
    else:
        for key in store.keys():
            if counted(key) and (partition := partition_of(key)) in counts:
                counts[partition] += 1
    return counts


def databases(stores: Iterable[Any]) -> Iterator[Any]:
    """The open RocksDB databases of ``stores`` (none for in-memory stores)."""
    for store in stores:
        if is_rocksdb(store):
            yield from list(store._dbs.values())
