"""Faust tables whose changelog holds raw key and value bytes, on the session's partition."""

from __future__ import annotations

import functools
from typing import Any

import faust

from streams._faust import rocksdb
from streams.partitions import partition_of

__all__ = ["KEY_SEPARATOR", "RawTable", "SessionKeyedTable", "session_of"]

# Between the session id and the index in a compound key. Session ids may not
# contain it (``schemas.actions`` rejects them), so a key is a session's own
# entry exactly when it has no separator.
KEY_SEPARATOR = "\x1f"


def session_of(key: str) -> str:
    return key.partition(KEY_SEPARATOR)[0]


class RawTable(faust.Table):
    """A table whose changelog holds the raw key and value bytes.

    Faust ignores ``schema=`` when writing a changelog; raw both ways keeps a key's
    bytes, and so its partition, those of the topics (tests/integration/test_reliability.py).
    """

    # Read with ``partition_count`` by the compiled changelog runs (native/src/changelog.rs)
    # to find a key's partition as ``partition_for_key`` does, without calling it.
    session_keyed = False

    def _serializer_from_type(self, typ: Any) -> str:
        return "raw"

    def _new_store(self) -> Any:
        store = super()._new_store()
        rocksdb.bound(store)  # before any database is opened
        return store

    def partition_for_key(self, key: Any) -> int:
        """The key's partition, computed like Kafka's default partitioner (murmur2).

        Needs no producer metadata (a just-created changelog has none, and Faust's
        write then raised), and is the session's partition in every topic
        (tests/integration/test_reliability.py).
        """
        return partition_of(key, self.partition_count)

    @functools.cached_property
    def partition_count(self) -> int:  # fixed for the table's life; looked up per write
        return int(self.partitions or self.app.conf.topic_partitions)


class SessionKeyedTable(RawTable):
    """A session's entry and its compound keys (``batch_key``) on the partition of
    the session, so each worker holds (and recovers) exactly the entries of the
    sessions it owns, and all of a session's changelog records are on one
    partition, in the order they were written."""

    session_keyed = True

    def partition_for_key(self, key: Any) -> int:
        return partition_of(key.partition(KEY_SEPARATOR)[0], self.partition_count)
