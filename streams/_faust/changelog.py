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

from collections.abc import Awaitable
from typing import Any, cast

from faust.types import TableT

from streams._faust import stores
from streams.app import ContextApp

__all__ = ["Written", "confirm", "write"]

# Changelog records written and not yet confirmed: (table, the broker's acknowledgement).
Written = list[tuple[TableT[str, bytes], Awaitable[Any]]]


def write(
    app: ContextApp, table: TableT[str, bytes], key: str, value: bytes | None
) -> Awaitable[Any]:
    """Produce ``table[key] = value``'s changelog record (``None`` deletes); the store
    applies it when the broker has it, before the returned acknowledgement resolves."""
    partition = cast(int, table.partition_for_key(key))
    store = cast(Any, table).data
    topic = table.changelog_topic.get_topic_name()
    return app.appender.append(
        topic, partition, key.encode(), value, then=lambda: stores.put(store, key, value, partition)
    )


async def confirm(written: Written) -> None:
    """Wait for the records' acknowledgements; RocksDB stores note the newest offsets."""
    newest: dict[tuple[int, Any], tuple[TableT[str, bytes], int]] = {}
    for table, ack in written:
        metadata = await ack
        newest[(id(table), metadata.topic_partition)] = (table, metadata.offset)
    for (_, tp), (table, offset) in newest.items():
        cast(Any, table).data.set_persisted_offset(tp, offset)
