"""The RocksDB store's memory is bounded by configuration, not by the data (_faust/rocksdb.py)."""

from __future__ import annotations

import os
from pathlib import Path

from streams._faust.rocksdb import BoundedRocksDBOptions, memory_bytes
from streams.app import create_app
from streams.settings import Settings
from streams.tables import session_table

CACHE_BYTES = 1024 * 1024


def test_all_databases_share_one_bounded_block_cache(tmp_path: Path) -> None:
    settings = Settings(
        store="rocksdb://", data_dir=tmp_path, rocksdb_block_cache_bytes=CACHE_BYTES
    )
    app = create_app(settings, role="pipeline")
    tables = [session_table(app, "sessions"), session_table(app, "batches")]
    stores = [table.data for table in tables]
    assert all(isinstance(s.rocksdb_options, BoundedRocksDBOptions) for s in stores)

    # 4 databases, each with ~4 MiB on disk: 16x the cache once all of it is read.
    dbs = [store._db_for_partition(p) for store in stores for p in (0, 1)]
    for db in dbs:
        for i in range(4096):
            db.put(f"session-{i:06d}".encode(), os.urandom(1024))
        db.flush()
    for db in dbs:
        for i in range(4096):
            assert db.get(f"session-{i:06d}".encode()) is not None

    usage = [db.property_int_value("rocksdb.block-cache-usage") for db in dbs]
    assert len(set(usage)) == 1, f"each database has its own cache: {usage}"
    memory = memory_bytes(stores)
    assert 0 < memory["block_cache"] <= CACHE_BYTES * 1.1  # LRU shards may overshoot a little
    # Index and filter blocks are in the cache, not beside it.
    assert memory["table_readers"] < 64 * 1024
