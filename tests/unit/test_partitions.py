"""Kafka's default partitioner, compiled (``native/src/partition.rs``) and in Python.

Every table write and keyed output asks for a partition; a compiled one that disagreed
with Kafka's would put a session's records on two partitions."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from hypothesis import given
from hypothesis import strategies as st

from streams.native import native
from streams.partitions import default_partitioner, partition_of, python_partition_of

needs_native = pytest.mark.skipif(native is None, reason="native/ not built")
KEYS = st.one_of(st.binary(max_size=64), st.text(max_size=40))
COUNTS = st.integers(min_value=1, max_value=1000)


def kafka(key: str | bytes, partitions: int) -> int:
    """aiokafka's own partitioner (Java's murmur2): the oracle."""
    raw = key if isinstance(key, bytes) else key.encode("utf-8")
    return DefaultPartitioner()(raw, list(range(partitions)), [])  # type: ignore[no-any-return]


@given(KEYS, COUNTS)
def test_partition_of_is_kafka_s_default_partitioner(key: str | bytes, partitions: int) -> None:
    assert partition_of(key, partitions) == kafka(key, partitions)
    assert python_partition_of(key, partitions) == kafka(key, partitions)


def test_known_keys() -> None:
    # Java's Utils.toPositive(Utils.murmur2("bench-1-00068".getBytes(UTF_8))) % 8, and others.
    for key in ("bench-1-00068", b"e3b0c442-98fc-1c14-9afb-f4c8996fb924", "", "é-ü-✓"):
        assert partition_of(key, 8) == kafka(key, 8)


@needs_native
def test_compiled_partitioner_is_the_one_in_use() -> None:
    assert native is not None
    assert partition_of is native.partition_of


@needs_native
def test_compiled_errors_are_python_s() -> None:
    with pytest.raises(ZeroDivisionError):
        partition_of(b"x", 0)
    with pytest.raises(ZeroDivisionError):
        python_partition_of(b"x", 0)
    with pytest.raises(UnicodeEncodeError):
        partition_of("\ud800", 8)
    with pytest.raises(UnicodeEncodeError):
        python_partition_of("\ud800", 8)
    assert partition_of(123, 8) == python_partition_of(123, 8)  # type: ignore[arg-type]
    assert partition_of(b"x", -3) == python_partition_of(b"x", -3)


@given(st.one_of(st.none(), st.binary(max_size=40)), st.integers(min_value=1, max_value=64))
def test_default_partitioner_is_aiokafka_s_for_keys(key: bytes | None, partitions: int) -> None:
    every = list(range(partitions))
    chosen = default_partitioner(key, every, every[:1])
    if key is None:
        assert chosen == 0  # any available one: here the only one
    else:
        assert chosen == DefaultPartitioner()(key, every, every)
