"""A diverted topic's fetched records read into Faust's messages by the compiled reader
(``native/src/fetch.rs``, installed by ``streams._faust.fetch``): the messages aiokafka's
``PartitionRecords`` and Faust's ``_to_message`` make of the same bytes, with the same
positions, for any record sets; None for what aiokafka must read itself."""

from __future__ import annotations

import struct
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka.consumer.fetcher import READ_UNCOMMITTED
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from aiokafka.record.memory_records import MemoryRecords
from aiokafka.record.util import calc_crc32c
from aiokafka.structs import TopicPartition
from faust.transport.drivers.aiokafka import Consumer
from faust.types.tuples import ConsumerMessage
from hypothesis import given, settings
from hypothesis import strategies as st

from streams._faust import fetch
from streams._faust.fetch import AiokafkaPartitionRecords
from streams.native import native

pytestmark = pytest.mark.skipif(native is None, reason="native/ not built")

TP = TopicPartition("context", 3)
SLOTS = [s for s in ConsumerMessage.__slots__ if s not in ("__weakref__", "span")]
HEADERS = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=2
)
RECORD = st.tuples(
    st.one_of(st.none(), st.binary(max_size=20)),
    st.one_of(st.none(), st.binary(max_size=300)),
    st.integers(min_value=0, max_value=10_000),  # ms after the batch's first timestamp
    HEADERS,
)
BATCH = st.tuples(
    st.lists(RECORD, min_size=1, max_size=8),
    st.integers(min_value=0, max_value=3),  # a gap before it (compaction)
    st.sampled_from(["create", "log_append", "control", "gzip"]),
)


def _batch(records: list[Any], base_offset: int, kind: str) -> bytes:
    codec = 1 if kind == "gzip" else 0  # gzip
    builder = DefaultRecordBatchBuilder(2, codec, 0, -1, -1, 0, 1 << 20)
    for offset, (key, value, delta, headers) in enumerate(records):
        builder.append(offset, 1_764_633_600_000 + delta, key, value, headers)
    raw = bytearray(builder.build())
    struct.pack_into(">q", raw, 0, base_offset)  # the broker's (outside the CRC)
    if kind in ("log_append", "control"):
        (attributes,) = struct.unpack_from(">h", raw, 21)
        attributes |= 0x08 if kind == "log_append" else 0x30  # control: transactional too
        struct.pack_into(">h", raw, 21, attributes)
        struct.pack_into(">I", raw, 17, calc_crc32c(bytes(raw[21:])))
    return bytes(raw)


def _record_set(batches: list[Any]) -> bytes:
    raw, offset = b"", 0
    for records, gap, kind in batches:
        offset += gap
        raw += _batch(records, offset, kind)
        offset += len(records)
    return raw


def _aiokafka(raw: bytes, fetch_offset: int) -> tuple[list[ConsumerMessage], list[int], int]:
    """aiokafka's reading and Faust's messages: the oracle."""
    records = AiokafkaPartitionRecords(
        TP, MemoryRecords(raw), [], fetch_offset, None, None, True, READ_UNCOMMITTED
    )
    consumer = SimpleNamespace(app=SimpleNamespace(consumer_generation_id=None))
    messages, ends = [], []
    for record in records:
        messages.append(Consumer._to_message(consumer, TP, record))  # type: ignore[arg-type]
        ends.append(records.next_fetch_offset)
    return messages, ends, records.next_fetch_offset


def _compiled(raw: bytes, fetch_offset: int) -> Any:
    reading = fetch._reading(lambda topic: True)
    records = reading(TP, fetch._KeptRecords(raw), [], fetch_offset, None, None, True, 0)
    if not isinstance(records, fetch._Fetched):
        return None
    messages, ends = [], []
    for message in records:
        messages.append(message)
        ends.append(records.next_fetch_offset)
    return messages, ends, records.next_fetch_offset


def _fields(message: ConsumerMessage) -> dict[str, Any]:
    return {slot: getattr(message, slot) for slot in SLOTS}


@settings(max_examples=300, deadline=None)
@given(st.lists(BATCH, min_size=1, max_size=4), st.integers(0, 12), st.integers(0, 40))
def test_messages_are_the_ones_aiokafka_and_faust_make(
    batches: list[Any], fetch_offset: int, cut: int
) -> None:
    raw = _record_set(batches)
    raw = raw[: len(raw) - cut] if cut else raw  # a fetch may end inside its last batch
    expected = _aiokafka(raw, fetch_offset)
    compiled = _compiled(raw, fetch_offset)
    if any(kind == "gzip" for _, _, kind in batches) and compiled is None:
        return  # declined: aiokafka reads it (its own codecs)
    assert compiled is not None
    messages, ends, final = compiled
    assert [type(m) for m in messages] == [type(m) for m in expected[0]]
    assert [_fields(m) for m in messages] == [_fields(m) for m in expected[0]]
    assert (ends, final) == expected[1:]


def test_a_set_aiokafka_must_read_is_declined() -> None:
    records = [(b"k", b"v", 0, [])]
    gzip = _batch(records, 0, "gzip")
    corrupt = bytearray(_batch(records, 0, "create"))
    corrupt[-1] ^= 0xFF  # aiokafka raises CorruptRecordException on it
    for raw in (gzip, bytes(corrupt)):
        assert native.fetched_messages(raw, 0, TP, ConsumerMessage, True) is None  # type: ignore[union-attr]
        reading = fetch._reading(lambda topic: True)
        records = reading(TP, fetch._KeptRecords(raw), [], 0, None, None, True, 0)
        assert isinstance(records, AiokafkaPartitionRecords)


def test_only_a_diverted_topic_is_read_compiled() -> None:
    raw = _batch([(b"k", b"v", 0, [])], 0, "create")
    reading = fetch._reading(lambda topic: topic == "context")
    other = TopicPartition("pipeline-sessions-changelog", 0)
    for tp, kind in ((TP, fetch._Fetched), (other, AiokafkaPartitionRecords)):
        assert isinstance(reading(tp, fetch._KeptRecords(raw), [], 0, None, None, True, 0), kind)


def test_the_workers_fetcher_reads_diverted_topics_compiled() -> None:
    import aiokafka.consumer.fetcher as fetcher

    import streams.app  # noqa: F401  (installs Faust's and aiokafka's patches)

    assert fetcher.MemoryRecords is fetch._KeptRecords
    assert fetcher.PartitionRecords is not AiokafkaPartitionRecords
