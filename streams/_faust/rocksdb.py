"""RocksDB for tables with memory bounded by configuration, not by the data.

Faust opens one database per table and partition, each with its own block
cache, and RocksDB keeps every table file's index and bloom filter in memory
outside that cache. So a worker's RSS grew with the partitions and with the
sessions it held (``python -m scripts.bench --mode memory`` measures it). Here all
databases of the process share
one LRU block cache, index and filter blocks are charged to it, and each
database has at most two small write buffers: RocksDB's part of RSS is at most
``block cache + databases x 2 x write buffer``, whatever the number of sessions.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from faust.stores.rocksdb import RocksDBOptions

from streams._faust import stores
from streams._faust.stores import databases

if TYPE_CHECKING:  # the rocksdb extra: imported where the store is used, not by every worker
    import rocksdict

__all__ = ["MEMORY_KINDS", "BoundedRocksDBOptions", "bound", "memory_bytes"]

MEMORY_KINDS = ("block_cache", "memtables", "table_readers")

BLOOM_BITS_PER_KEY = 10  # ~1% false positives: a new session's lookup rarely reads a block


@functools.cache
def _shared_cache(size: int) -> rocksdict.Cache:
    from rocksdict import Cache

    return Cache(size)


class BoundedRocksDBOptions(RocksDBOptions):
    """Faust's rocksdict options, with the process-wide cache described above."""

    def as_options(self) -> rocksdict.Options:
        from rocksdict import BlockBasedOptions

        options = super().as_options()
        table = BlockBasedOptions()
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        table.set_block_cache(_shared_cache(self.block_cache_size))
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_l0_filter_and_index_blocks_in_cache(True)
        options.set_block_based_table_factory(table)
        return options


def bound(store: Any) -> None:
    """Make a Faust RocksDB store open its databases with :class:`BoundedRocksDBOptions`."""
    if stores.is_rocksdb(store) and store.use_rocksdict:
        store.rocksdb_options = BoundedRocksDBOptions(**(store.options or {}), use_rocksdict=True)


def memory_bytes(stores: Iterable[Any]) -> dict[str, int]:
    """RocksDB's own memory across ``stores``' open databases, by kind."""
    totals = dict.fromkeys(MEMORY_KINDS, 0)
    for db in databases(stores):
        totals["memtables"] += db.property_int_value("rocksdb.cur-size-all-mem-tables") or 0
        totals["table_readers"] += db.property_int_value("rocksdb.estimate-table-readers-mem") or 0
        # The cache is shared: every database reports the same usage.
        totals["block_cache"] = db.property_int_value("rocksdb.block-cache-usage") or 0
    return totals
