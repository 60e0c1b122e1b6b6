"""``streams._faust.appender`` against a real broker: shared acknowledgements, and ``then``
callbacks that run only once the broker has the records (``streams._faust.changelog``
makes a table's store take a value there, so the store never holds what the
changelog does not). Each test runs with aiokafka's batch builder and with the compiled
one the workers use (``native.record_batches``), which an idempotent producer sends: the
broker checks its sequence numbers and CRCs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.structs import RecordMetadata

from streams._faust.appender import Appender
from streams.native import native
from tests.support.kafka_io import scratch_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kafka

PARTITIONS = 2


@pytest.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    async with scratch_topic(kafka_bootstrap, "appender", PARTITIONS) as name:
        yield name


@pytest.fixture(params=["aiokafka", "compiled"])
def builder(request: pytest.FixtureRequest) -> str:
    if request.param == "compiled" and native is None:
        pytest.skip("native/ not built")
    return str(request.param)


def _appender(producer: AIOKafkaProducer, builder: str, batch_bytes: int = 16_384) -> Appender:
    """An appender on ``builder``'s batches (``batch_bytes``: the producer's batch size)."""
    return Appender(lambda: producer, batch_bytes=batch_bytes if builder == "compiled" else None)


def _producer(bootstrap: str, builder: str, **config: Any) -> AIOKafkaProducer:
    idempotent = builder == "compiled"  # as the workers' producers are
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=idempotent, **config
    )


@pytest.fixture
async def producer(
    kafka_bootstrap: str, topic: str, builder: str
) -> AsyncIterator[AIOKafkaProducer]:
    producer = _producer(kafka_bootstrap, builder)
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
    kafka_bootstrap: str, topic: str, producer: AIOKafkaProducer, builder: str
) -> None:
    appender = _appender(producer, builder)
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


async def test_a_failed_append_runs_no_callback(
    topic: str, producer: AIOKafkaProducer, builder: str
) -> None:
    appender = _appender(producer, builder)
    ran: list[int] = []
    missing_partition = PARTITIONS + 3
    ack = appender.append(topic, missing_partition, b"k", b"v", then=lambda: ran.append(1))
    with pytest.raises(AssertionError, match="Unrecognized partition"):  # aiokafka's check
        await asyncio.wait_for(ack, timeout=30)
    assert ran == []


class _SendBatchLog:
    """Wraps a real producer's ``send_batch`` and notes each call: (partition, records)."""

    def __init__(self, producer: AIOKafkaProducer) -> None:
        self.calls: list[tuple[int, int]] = []
        self.called = asyncio.Event()
        self._send_batch = producer.send_batch
        producer.send_batch = self._logged  # type: ignore[method-assign]

    async def _logged(self, batch: Any, topic: str, *, partition: int) -> Any:
        self.calls.append((partition, batch.record_count()))
        self.called.set()
        return await self._send_batch(batch, topic, partition=partition)


async def test_what_is_appended_while_a_round_is_in_flight_goes_next_as_one_batch(
    kafka_bootstrap: str, topic: str, producer: AIOKafkaProducer, builder: str
) -> None:
    log = _SendBatchLog(producer)
    appender = _appender(producer, builder)
    for _ in range(5):  # the broker may answer before this task's next turn: try again
        log.calls.clear()
        log.called.clear()
        first = appender.append(topic, 0, b"k", b"first")
        await log.called.wait()
        # One record per event-loop turn, for as long as the first round is not
        # acknowledged: each turn wakes the appender, which must hold them.
        later = []
        while not first.done() and len(later) < 50:
            later.append(appender.append(topic, 0, b"k", f"v{len(later)}".encode()))
            await asyncio.sleep(0)
        acknowledged = await asyncio.gather(first, *later)
        if later:
            break
    assert later, "the broker acknowledged every first round within a turn"

    assert log.calls == [(0, 1), (0, len(later))]
    ends = await _end_offsets(kafka_bootstrap, topic)
    assert acknowledged[-1].offset == ends[0] - 1


async def test_every_groups_first_batch_goes_before_any_second(
    kafka_bootstrap: str, topic: str, builder: str
) -> None:
    producer = _producer(kafka_bootstrap, builder, max_batch_size=4096)
    await producer.start()
    try:
        await wait_for(lambda: _has_partitions(producer, topic), timeout=30, message="no metadata")
        log = _SendBatchLog(producer)
        appender = _appender(producer, builder, batch_bytes=4096)
        # Three batches' worth per partition, appended in one turn: one round.
        acks = [
            appender.append(topic, partition, b"k", f"{partition}-{i}-".encode() * 100)
            for i in range(20)
            for partition in range(PARTITIONS)
        ]
        await asyncio.gather(*acks)
    finally:
        await producer.stop()

    partitions_in_call_order = [partition for partition, _ in log.calls]
    batches_each = len(log.calls) // PARTITIONS
    assert batches_each >= 2, f"the records fitted one batch per partition: {log.calls}"
    # Layer by layer: the producer takes a partition's next batch only once the one
    # before is in a request, and a group's second batch would go out alone.
    assert partitions_in_call_order == list(range(PARTITIONS)) * batches_each
    assert [n for p, n in log.calls if p == 0] == [n for p, n in log.calls if p == 1]
    assert sum(n for _, n in log.calls) == 20 * PARTITIONS
    assert await _values_in_order(kafka_bootstrap, topic, 0) == [
        f"0-{i}-".encode() * 100 for i in range(20)
    ]


async def _values_in_order(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        values: list[bytes] = []
        while len(values) < end:
            for records in (await consumer.getmany(tp, timeout_ms=1000)).values():
                values.extend(record.value for record in records)
        return values
    finally:
        await consumer.stop()
