"""Table declarations: raw-bytes values that each owner encodes compactly.

``use_partitioner=True`` puts each key's changelog record on the partition its
key hashes to, which is the session's partition in every topic (all topics are
keyed by session_id with the same partition count). That also lets timers and
per-session tasks, which run outside a stream event, write to tables.
"""

from __future__ import annotations

from typing import Any

import faust
from aiokafka.partitioner import murmur2

from streams.app import ContextApp

__all__ = ["batch_key", "batch_table", "owned_partitions", "session_of", "session_table"]

# Between the session id and the index in a compound key. The index (digits)
# comes last, so splitting at the last separator is right whatever the id holds.
KEY_SEPARATOR = "\x1f"


def batch_key(session_id: str, index: int) -> str:
    return f"{session_id}{KEY_SEPARATOR}{index}"


def session_of(key: str) -> str:
    return key.rsplit(KEY_SEPARATOR, 1)[0]


class _RawTable(faust.Table):
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
        raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
        return (murmur2(raw) & 0x7FFFFFFF) % int(self.partitions or self.app.conf.topic_partitions)


class _SessionKeyedTable(_RawTable):
    """Compound keys (``batch_key``) on the partition of their session, so each
    worker holds (and recovers) exactly the entries of the sessions it owns."""

    def partition_for_key(self, key: Any) -> int:
        return super().partition_for_key(session_of(key))


def session_table(app: ContextApp, name: str) -> faust.Table:
    """A table keyed by session id, raw bytes values."""
    return _declare(app, _RawTable, name)


def batch_table(app: ContextApp, name: str) -> faust.Table:
    """A table keyed by ``batch_key(session_id, n)``, on the session's partition."""
    return _declare(app, _SessionKeyedTable, name)


def _declare(app: ContextApp, cls: type[_RawTable], name: str) -> faust.Table:
    table = cls(
        app,
        name=name,
        default=None,
        beacon=app.tables.beacon,
        key_type=str,
        value_type=bytes,
        partitions=app.settings.partitions,
        use_partitioner=True,
    )
    return app.tables.add(table)  # type: ignore[return-value]


def owned_partitions(app: faust.App, topic: faust.TopicT) -> set[int]:
    """The partitions of ``topic`` this worker is assigned now (empty while starting).

    Fix (found by tests/test_reliability.py, idle expiry after a rebalance): a
    table's in-memory store keeps the entries it wrote for partitions revoked
    since (Faust drops only entries it restored from the changelog), so a timer
    walking ``table.items()`` also sees sessions another worker owns now, with
    stale state. Timers must skip keys whose ``partition_for_key`` is not here.
    """
    name = topic.get_topic_name()
    try:
        assigned = app.consumer.assignment()
    except Exception:  # the consumer is not started yet, or being replaced
        return set()
    return {tp.partition for tp in assigned if tp.topic == name}
