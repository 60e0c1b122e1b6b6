"""Faust tables whose changelog holds raw key and value bytes, on the session's partition."""

from __future__ import annotations

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

    Fix (found by tests/test_reliability.py): Faust derives a table's own
    changelog serializers from ``key_type``/``value_type`` only and ignores a
    ``schema=`` argument for writing, so these tables used to write the key as
    JSON (``"sid"`` with quotes) and read the value back through JSON as a dict.
    Two consequences: (1) every restart crashed the agents while recovering
    (``SessionState.from_bytes(dict)``), and (2) the quoted key hashed to a
    different partition than the session's raw key in the topics, so a worker
    owning a session's partition did not recover that session's state. Raw
    both ways keeps the key bytes identical to the topics' keys.
    """

    def _serializer_from_type(self, typ: Any) -> str:
        return "raw"

    def _new_store(self) -> Any:
        store = super()._new_store()
        rocksdb.bound(store)  # before any database is opened
        return store

    def partition_for_key(self, key: Any) -> int:
        """The key's partition, computed like Kafka's default partitioner (murmur2).

        Fix (found by tests/test_reliability.py, a sink worker's first writes on a
        fresh broker): with ``use_partitioner`` Faust asks the producer to pick the
        partition, and the producer raises ``TypeError`` when it has no metadata
        for the changelog topic yet (just created). The write failed, the lane
        handling the session stopped with its event never acknowledged, commits
        stopped for that partition, the context lost the operation, and the next
        rebalance hung waiting for the unacknowledged events. Computing the
        partition needs no metadata, and is by construction the session's
        partition in every topic.
        """
        return partition_of(key, int(self.partitions or self.app.conf.topic_partitions))


class SessionKeyedTable(RawTable):
    """A session's entry and its compound keys (``batch_key``) on the partition of
    the session, so each worker holds (and recovers) exactly the entries of the
    sessions it owns, and all of a session's changelog records are on one
    partition, in the order they were written."""

    def partition_for_key(self, key: Any) -> int:
        return super().partition_for_key(session_of(key))
