"""``streams._faust.divert._wait_next_records`` against a real broker: records that
aiokafka hands out and Faust's getmany drops are fetched again.

Faust's own ``_wait_next_records`` runs over a real ``AIOKafkaConsumer``; the stand-in
holds only the consumer state it reads (the flow, the live set of active partitions),
which a test changes as a rebalance would while the fetch waits.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from faust.types import TP

from streams._faust import consumer as consumer_module
from streams._faust import divert
from streams.app import create_app
from streams.settings import Settings
from tests.support.kafka_io import scratch_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kafka

STREAM, CHANGELOG = 0, 1  # the topic's two partitions, in the roles they play


@dataclass
class FetchingConsumer:
    """What Faust's ``Consumer._wait_next_records`` and the patch read, over aiokafka."""

    kafka: AIOKafkaConsumer
    active: set[TP]
    flow_active: bool = True
    _buffered_partitions: set[TP] = field(default_factory=set)
    app: Any = field(default_factory=lambda: SimpleNamespace(client_only=False))
    not_waiting_next_records: asyncio.Event = field(default_factory=asyncio.Event)
    fetching: asyncio.Event = field(default_factory=asyncio.Event)  # a fetch is waiting

    def _get_active_partitions(self) -> set[TP]:
        return self.active  # Faust's live set: a rebalance empties it during a wait

    async def _getmany(self, active_partitions: set[TP], timeout: float) -> Any:
        # As faust.transport.drivers.aiokafka's ``_fetch_records``.
        self.fetching.set()
        return await self.kafka._fetcher.fetched_records(active_partitions, timeout=timeout)

    def assignment(self) -> set[TP]:
        return {TP(tp.topic, tp.partition) for tp in self.kafka.assignment()}

    async def seek(self, partition: TP, offset: int) -> None:
        self.kafka.seek(TopicPartition(partition.topic, partition.partition), offset)


@pytest.fixture
async def topic(kafka_bootstrap: str) -> AsyncIterator[str]:
    async with scratch_topic(kafka_bootstrap, "fetch", 2) as name:
        yield name


@pytest.fixture
async def kafka(kafka_bootstrap: str, topic: str) -> AsyncIterator[AIOKafkaConsumer]:
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    consumer.assign([TopicPartition(topic, p) for p in (STREAM, CHANGELOG)])
    try:
        yield consumer
    finally:
        await consumer.stop()


async def produce(bootstrap: str, topic: str, partition: int, *values: bytes) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        for value in values:
            await producer.send_and_wait(topic, value, partition=partition)
    finally:
        await producer.stop()


async def test_records_handed_out_while_a_rebalance_pauses_everything_are_fetched_again(
    kafka_bootstrap: str, topic: str, kafka: AIOKafkaConsumer
) -> None:
    consumer = FetchingConsumer(kafka, active={TP(topic, STREAM)})
    waiting = asyncio.create_task(divert._wait_next_records(consumer, 20.0))  # type: ignore[arg-type]
    await consumer.fetching.wait()  # the fetch is waiting; now a rebalance begins:
    consumer.flow_active = False  # Faust's stop_flow() ...
    consumer.active.clear()  # ... and pause_partitions(assignment)
    # Recovery has positioned the changelog partition; its records arrive.
    await produce(kafka_bootstrap, topic, CHANGELOG, b"a", b"b", b"c")

    records, _ = await waiting
    # aiokafka reads an empty set of partitions as "all of them": it handed out the
    # changelog's records, and Faust's getmany drops the batch (the flow is stopped).
    assert records is not None
    assert [r.value for r in records[TP(topic, CHANGELOG)]][:1] == [b"a"]

    # Recovery resumes the changelog partition and the flow: every record comes again.
    consumer.flow_active = True
    consumer.active.add(TP(topic, CHANGELOG))
    values: list[bytes] = []
    while len(values) < 3:
        again, _ = await divert._wait_next_records(consumer, 20.0)  # type: ignore[arg-type]
        assert again, "the changelog's records were not fetched again"
        values += [r.value for r in again[TP(topic, CHANGELOG)]]
    assert values == [b"a", b"b", b"c"]


async def test_a_delivered_batch_is_not_fetched_again(
    kafka_bootstrap: str, topic: str, kafka: AIOKafkaConsumer
) -> None:
    consumer = FetchingConsumer(kafka, active={TP(topic, STREAM), TP(topic, CHANGELOG)})
    await produce(kafka_bootstrap, topic, STREAM, b"x")

    records, _ = await divert._wait_next_records(consumer, 20.0)  # type: ignore[arg-type]
    assert records is not None
    assert [r.value for r in records[TP(topic, STREAM)]] == [b"x"]
    assert await kafka.position(TopicPartition(topic, STREAM)) == 1  # not sought back


async def test_a_fetch_waits_at_the_broker_while_records_come_and_not_when_idle(
    kafka_bootstrap: str, topic: str, kafka: AIOKafkaConsumer, tmp_path: Path
) -> None:
    """``wait_while_busy`` on a real fetcher: the request after records waits for the
    settings' bytes or time (a round per ~10 ms of arrivals, not per record); the one after
    an empty fetch blocks as Faust's did, for up to 1.5 s (no polling when idle). A worker's
    consumer gets it when it starts, on the loop or in Faust's thread."""
    fetcher = kafka._fetcher
    idle, busy = (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms), (64 * 1024, 10)
    consumer_module.wait_while_busy(fetcher, busy)
    await produce(kafka_bootstrap, topic, STREAM, b"x")
    records = await kafka.getmany(timeout_ms=20_000)
    assert [r.value for r in records[TopicPartition(topic, STREAM)]] == [b"x"]
    assert (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == busy
    # Nothing more comes: the busy request returns empty after 10 ms, the next is idle.
    await wait_for(lambda: (fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms) == idle)

    for on_loop in (True, False):
        app = create_app(
            Settings(
                data_dir=tmp_path,
                kafka_bootstrap_servers=kafka_bootstrap,
                consumer_thread=not on_loop,
            ),
            role="sink-null",
        )
        thread: Any = app.consumer._thread
        if not on_loop:
            thread.thread_loop.close()  # made for Faust's thread; on_start runs here instead
            thread.thread_loop = asyncio.get_running_loop()
        await thread.on_start()
        try:
            started = thread._consumer._fetcher
            assert started._proc_fetch_request.__qualname__.startswith("wait_while_busy")
        finally:
            await thread._consumer.stop()
