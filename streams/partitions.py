"""A key's partition, as Kafka's default partitioner picks it (murmur2 of the key bytes).

Every table write and keyed output asks for one. Compiled where ``native/`` is built
(~0.1 µs a key); else aiokafka's pure-Python murmur2 (4.6 µs a 13-byte key, 10.8 a UUID's
36), cached for the keys seen last, which a workload with more live sessions than the
cache holds misses on every record (tests/unit/test_partitions.py: the two agree).
"""

from __future__ import annotations

import functools
import random

from aiokafka.partitioner import murmur2

from streams.native import native

__all__ = ["default_partitioner", "partition_of", "python_partition_of"]


@functools.lru_cache(maxsize=16_384)
def python_partition_of(key: str | bytes, partitions: int) -> int:
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    return (murmur2(raw) & 0x7FFFFFFF) % partitions


partition_of = python_partition_of if native is None else native.partition_of


def default_partitioner(key: bytes | None, all_partitions: list[int], available: list[int]) -> int:
    """aiokafka's ``DefaultPartitioner`` on :func:`partition_of`, for an ``AIOKafkaProducer``'s
    ``partitioner``: a key's partition as Faust and the workers pick it, any one without."""
    if key is None:
        return random.choice(available or all_partitions)
    return all_partitions[partition_of(key, len(all_partitions))]
