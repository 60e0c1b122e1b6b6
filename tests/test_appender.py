"""``streams.appender`` against a real broker: shared acknowledgements, and ``then``
callbacks that run only once the broker has the records (``streams.changelog``
makes a table's store take a value there, so the store never holds what the
changelog does not)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.structs import RecordMetadata

from streams.appender import Appender
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 2


@pytest.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    name = f"appender-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, PARTITIONS, 1)])
        yield name
        await admin.delete_topics([name])
    finally:
        await admin.close()


@pytest.fixture
async def producer(kafka_bootstrap: str, topic: str) -> AsyncIterator[AIOKafkaProducer]:
    producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
    await producer.start()
    try:
        await wait_for(  # the topic's metadata reaches the producer a moment after creation
            lambda: _has_partitions(producer, topic), timeout=30, message="no metadata"
        )
        yield producer
    finally:
        await producer.stop()


async def _has_partitions(producer: AIOKafkaProducer, topic: str) -> bool:
    return len(await producer.partitions_for(topic)) == PARTITIONS


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(PARTITIONS)])
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def test_then_callbacks_run_in_order_once_the_broker_has_the_records(
    kafka_bootstrap: str, topic: str, producer: AIOKafkaProducer
) -> None:
    appender = Appender(lambda: producer)
    ran: list[int] = []
    seen_at_acknowledgement: dict[int, list[int]] = {}  # partition -> callbacks run by then

    def on_acknowledged(partition: int) -> None:
        seen_at_acknowledgement[partition] = [i for i in ran if i % PARTITIONS == partition]

    acks: list[asyncio.Future[RecordMetadata]] = []
    for i in range(20):
        ack = appender.append(
            topic, i % PARTITIONS, f"k{i}".encode(), b"v", then=lambda i=i: ran.append(i)
        )
        if i < PARTITIONS:  # a round's records share one acknowledgement
            ack.add_done_callback(lambda _, p=i: on_acknowledged(p))
        acks.append(ack)

    assert ran == [], "a callback ran before the records were even handed to the producer"
    acknowledged = await asyncio.gather(*acks)

    # Each partition's callbacks ran in append order, all before its acknowledgement resolved.
    for partition in range(PARTITIONS):
        assert seen_at_acknowledgement[partition] == list(range(partition, 20, PARTITIONS))
    assert sorted(ran) == list(range(20))
    # One acknowledgement per partition's round, carrying its last record's offset.
    ends = await _end_offsets(kafka_bootstrap, topic)
    for partition in range(PARTITIONS):
        assert acknowledged[partition].offset == ends[partition] - 1


async def test_a_failed_append_runs_no_callback(topic: str, producer: AIOKafkaProducer) -> None:
    appender = Appender(lambda: producer)
    ran: list[int] = []
    missing_partition = PARTITIONS + 3
    ack = appender.append(topic, missing_partition, b"k", b"v", then=lambda: ran.append(1))
    with pytest.raises(AssertionError, match="Unrecognized partition"):  # aiokafka's check
        await asyncio.wait_for(ack, timeout=30)
    assert ran == []
