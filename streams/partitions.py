"""A key's partition, as Kafka's default partitioner picks it (murmur2 of the key bytes)."""

from __future__ import annotations

import functools

from aiokafka.partitioner import murmur2

__all__ = ["partition_of"]


@functools.lru_cache(maxsize=16_384)  # murmur2 is pure Python: a tenth of a sink's CPU
def partition_of(key: str | bytes, partitions: int) -> int:
    raw = key if isinstance(key, bytes) else str(key).encode("utf-8")
    return (murmur2(raw) & 0x7FFFFFFF) % partitions
