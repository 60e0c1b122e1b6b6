"""Table writes produced straight to the changelog, for hot paths.

Faust's own table write (``table[key] = value``) sends each changelog record as
a FutureMessage through its producer buffer: measured on the accumulator, that
path cost more than all of our per-event work. Here a write appends the record
to its partition's next batch (``streams._faust.appender``), in the format Faust's
recovery reads (same topic and partition, raw key and value bytes; None is a
tombstone), and the store takes the value once the broker has the record.
The caller awaits the returned acknowledgement before it lets the input that
caused the write be committed, then calls :func:`confirm` so that a RocksDB
store notes what it holds (as Faust's changelog callback would).

A store that only holds acknowledged records is a prefix of the changelog, which
recovery makes whole (tests/unit/test_rocksdb_store.py; docs/decisions.md). Until then
readers see pending values through ``streams._faust.write_behind``'s overlay.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any, cast

from faust.types import TableT

from streams._faust import stores
from streams.app import ContextApp
from streams.native import native

__all__ = ["Written", "confirm", "write", "write_all"]

# Changelog records written and not yet confirmed: (table, the broker's acknowledgement).
Written = list[tuple[TableT[str, bytes], Awaitable[Any]]]


def write(
    app: ContextApp, table: TableT[str, bytes], key: str, value: bytes | None
) -> Awaitable[Any]:
    """Produce ``table[key] = value``'s changelog record (``None`` deletes); the store
    applies it when the broker has it, before the returned acknowledgement resolves."""
    return write_all(app, [(table, key, value)])[0][1]


def write_all(
    app: ContextApp, writes: Iterable[Sequence[Any]], *, may_wait: bool = False
) -> Written:
    """:func:`write` each of ``writes`` (tuples starting ``table, key, value``), in order:
    one append and one store update per table partition, not per record
    (tests/unit/test_changelog.py proves the records, stores and acks the same).
    ``may_wait``: the records join the appender's next round (``Appender.append_all``)."""
    writes = writes if isinstance(writes, list) else list(writes)
    runs = _runs(writes) if native is None else native.changelog_runs(writes)
    appender, written = app.appender, cast(Written, [])
    for table, partition, entries, records in runs:
        then = functools.partial(stores.put, cast(Any, table).data, entries, partition)
        topic = table.changelog_topic.get_topic_name()
        acknowledged = appender.append_all(topic, partition, records, then, may_wait=may_wait)
        written.append((table, acknowledged))
    return written


def _runs(writes: list[Sequence[Any]]) -> list[tuple[Any, int, list[Any], list[Any]]]:
    """(table, partition, its [(key, value)], the records [(key bytes, value)]) per table
    partition, first written first: ``native.changelog_runs``'s Python twin."""
    runs: dict[tuple[int, int], tuple[TableT[str, bytes], int, list[Any]]] = {}
    for write in writes:
        table = write[0]
        partition = cast(int, table.partition_for_key(write[1]))
        run = runs.get((id(table), partition))
        if run is None:
            run = runs[(id(table), partition)] = (table, partition, [])
        run[2].append((write[1], write[2]))
    return [
        (table, partition, entries, [(key.encode(), value) for key, value in entries])
        for table, partition, entries in runs.values()
    ]


async def confirm(written: Written) -> None:
    """Wait for the records' acknowledgements; RocksDB stores note the newest offsets."""
    newest: dict[tuple[int, Any], tuple[TableT[str, bytes], int]] = {}
    for table, ack in written:
        metadata = await ack
        newest[(id(table), metadata.topic_partition)] = (table, metadata.offset)
    for (_, tp), (table, offset) in newest.items():
        cast(Any, table).data.set_persisted_offset(tp, offset)
