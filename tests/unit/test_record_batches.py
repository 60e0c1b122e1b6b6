"""Kafka record batches built whole by the compiled builder (``native/src/batch.rs``), which
the appender hands to aiokafka in place of its ``BatchBuilder``: the same bytes, split
into the same batches, for any records (tests/integration/test_appender.py sends them)."""

from __future__ import annotations

import pytest
from aiokafka.producer.message_accumulator import BatchBuilder
from aiokafka.record.default_records import DefaultRecordBatch
from hypothesis import given, settings
from hypothesis import strategies as st

from streams.app import create_app
from streams.native import native
from streams.settings import Settings

pytestmark = pytest.mark.skipif(native is None, reason="native/ not built")

RECORDS = st.lists(
    st.tuples(st.binary(max_size=40), st.one_of(st.none(), st.binary(max_size=3000))),
    min_size=1,
    max_size=60,
)
TIMESTAMP = 1_764_633_600_123  # ms: every record of a round shares one


def aiokafka_batches(records: list[tuple[bytes, bytes | None]], size: int) -> list[BatchBuilder]:
    """aiokafka's builder, filled as the appender fills it (``_batches``): the oracle."""
    batches = [BatchBuilder(size, 0)]
    for key, value in records:
        if batches[-1].append(key=key, value=value, timestamp=TIMESTAMP) is None:
            batches.append(BatchBuilder(size, 0))
            batches[-1].append(key=key, value=value, timestamp=TIMESTAMP)
    return batches


@settings(max_examples=300, deadline=None)
@given(RECORDS, st.integers(min_value=100, max_value=20_000), st.booleans())
def test_batches_are_the_bytes_aiokafka_builds(
    records: list[tuple[bytes, bytes | None]], size: int, idempotent: bool
) -> None:
    ours = native.record_batches(records, size, TIMESTAMP)  # type: ignore[union-attr]
    theirs = aiokafka_batches(records, size)
    assert [b.record_count() for b in ours] == [b.record_count() for b in theirs]
    for sequence, (built, oracle) in enumerate(zip(ours, theirs, strict=True)):
        if idempotent:  # as aiokafka's sender does before it builds a batch
            built._set_producer_state(4_000_000_001, 7, 1_000 * sequence)
            oracle._set_producer_state(4_000_000_001, 7, 1_000 * sequence)
        assert built._build() == bytes(oracle._build())


@given(RECORDS)
def test_a_batch_reads_back_as_its_records(records: list[tuple[bytes, bytes | None]]) -> None:
    read = []
    for batch in native.record_batches(records, 16_384, TIMESTAMP):  # type: ignore[union-attr]
        parsed = DefaultRecordBatch(batch._build())
        assert parsed.validate_crc()
        read += [(r.key, r.value) for r in parsed]
    assert read == records


def test_a_built_batch_takes_no_more_records() -> None:
    (batch,) = native.record_batches([(b"k", b"v")], 16_384, TIMESTAMP)  # type: ignore[union-attr]
    # aiokafka's send() appends to a partition's last batch unless it is closed.
    assert batch.closed()
    assert batch.append(timestamp=None, key=b"k", value=b"w", headers=[]) is None
    assert batch.record_count() == 1
    size = batch.size()
    assert batch._build() == batch._build()  # built once, as aiokafka's builder
    assert batch.size() == size == len(batch._build())


def test_a_record_is_a_pair_of_bytes() -> None:
    with pytest.raises(TypeError):
        native.record_batches([(b"k", "text")], 16_384, TIMESTAMP)  # type: ignore[union-attr]
    with pytest.raises(TypeError):
        native.record_batches([(b"k",)], 16_384, TIMESTAMP)  # type: ignore[union-attr]


def test_the_workers_appender_builds_its_batches_compiled_unless_they_are_compressed() -> None:
    app = create_app(Settings(), "pipeline")
    assert app.appender._batch_bytes == app.conf.producer_max_batch_size
    compressed = create_app(Settings(), "pipeline")
    compressed.conf.producer_compression_type = "lz4"  # the compiled builder writes no codec
    assert compressed.appender._batch_bytes is None
