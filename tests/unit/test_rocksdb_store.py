"""The RocksDB store: its memory bounded by configuration, not by the data (_faust/rocksdb.py),
its writes, and the extra it needs only where it is used."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streams._faust.rocksdb import BoundedRocksDBOptions, memory_bytes
from streams._faust.stores import put, read
from streams.app import create_app
from streams.settings import ConfigurationError, Settings, from_environment
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


def test_acknowledged_records_are_written_in_order_into_the_key_s_partition(
    tmp_path: Path,
) -> None:
    """``stores.put``: one WriteBatch per call, applied in order (a key written twice, deleted,
    written again), into the database of the records' partition, where ``read`` finds them."""
    app = create_app(Settings(store="rocksdb://", data_dir=tmp_path), role="pipeline")
    table = session_table(app, "sessions")
    keys = [f"session-{i}" for i in range(40)]
    partition = table.partition_for_key(keys[0])
    mine = [k for k in keys if table.partition_for_key(k) == partition][:3]
    a, b, c = mine
    put(table.data, [(a, b"1"), (b, b"x"), (a, b"2"), (b, None), (c, None), (c, b"3")], partition)
    assert [read(table, k) for k in (a, b, c)] == [b"2", None, b"3"]
    put(table.data, [(a, None)], partition)
    put(table.data, [], partition)  # nothing to write: no empty batch
    assert read(table, a) is None
    others = [p for p in table.data._dbs if p != partition]
    assert all(table.data._dbs[p].get(c.encode()) is None for p in others)


def test_workers_start_without_the_rocksdb_extra() -> None:
    """rocksdict is the ``rocksdb`` extra: a worker on the default in-memory store imports
    and declares its tables without it (the stream layer imported it for every worker)."""
    code = (
        "import sys; sys.modules['rocksdict'] = None\n"
        "import agents.app, sinks.app\n"
        "from streams.app import create_app\n"
        "from streams.settings import Settings\n"
        "from streams.tables import session_keyed_table\n"
        "session_keyed_table(create_app(Settings(), role='pipeline'), 'sessions')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_store_setting_is_checked_with_a_one_line_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AC_STORE", "redis://")
    with pytest.raises(ConfigurationError, match=r"^invalid setting AC_STORE: 'redis://': must be"):
        from_environment(Settings)
    monkeypatch.setenv("AC_STORE", "rocksdb://")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "rocksdict" else real(name)
    )
    with pytest.raises(ConfigurationError, match=r"rocksdb:// needs the rocksdb extra: pip"):
        from_environment(Settings)
