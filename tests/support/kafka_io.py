"""Raw Kafka I/O for reliability tests: produce bytes, stream payloads, read topics back.

The checks compare what reached a destination with what the broker actually
holds in ``actions`` (read back at the end), not with what a producer meant to
send: a producer retry during a broker restart may write a payload twice, and
then the service must deliver it twice, in the order the broker has it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from streams.settings import Settings
from streams.topics import ensure_topics

__all__ = [
    "Record",
    "StreamProducer",
    "committed_offsets",
    "delete_topics",
    "produce_payloads",
    "produce_raw",
    "read_topic",
    "settings_for",
    "uncommitted",
]

log = logging.getLogger(__name__)

# Big enough for a dead letter of a message at the broker's 1 MB limit.
FETCH_BYTES = 8 * 1024 * 1024


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def settings_for(env: dict[str, str]) -> Settings:
    return Settings(
        kafka_bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"],
        topic_prefix=env["AC_TOPIC_PREFIX"],
        partitions=int(env["AC_PARTITIONS"]),
        app_id=env["AC_APP_ID"],
    )


def _producer(bootstrap: str, **options: Any) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_request_size=1_048_576,
        # Ride out a broker restart instead of failing the batch.
        request_timeout_ms=60_000,
        retry_backoff_ms=200,
        **options,
    )


async def produce_raw(
    env: dict[str, str], messages: Iterable[tuple[bytes | None, bytes | None]]
) -> None:
    """Produce ``(key, value)`` byte pairs to ``actions`` as they are, acknowledged."""
    settings = settings_for(env)
    await ensure_topics(settings)
    producer = _producer(settings.kafka_bootstrap_servers)
    await producer.start()
    try:
        futures = [
            await producer.send(settings.topic("actions"), value, key=key)
            for key, value in messages
        ]
        for fut in futures:
            await fut
    finally:
        await producer.stop()


async def produce_payloads(env: dict[str, str], payloads: Iterable[dict[str, Any]]) -> None:
    """Produce JSON payloads keyed by their session_id, in order, acknowledged."""
    await produce_raw(env, ((str(p["session_id"]).encode(), orjson.dumps(p)) for p in payloads))


async def read_topic(
    env: dict[str, str], name: str, *, timeout: float = 60.0, prefixed: bool = True
) -> list[Record]:
    """Everything in topic ``name`` now, in partition then offset order (``prefixed``:
    under ``AC_TOPIC_PREFIX``; a changelog topic is named by its app instead)."""
    settings = settings_for(env)
    topic = settings.topic(name) if prefixed else name
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=FETCH_BYTES,
        fetch_max_bytes=FETCH_BYTES,
        isolation_level="read_committed",
    )
    await consumer.start()
    try:
        partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(partitions)
        await consumer.seek_to_beginning(*partitions)
        ends = await consumer.end_offsets(partitions)
        out: dict[int, list[Record]] = {p.partition: [] for p in partitions}
        deadline = time.monotonic() + timeout

        async def behind() -> bool:
            for tp in partitions:
                if await consumer.position(tp) < ends[tp]:
                    return True
            return False

        while await behind():
            if time.monotonic() > deadline:
                raise AssertionError(f"reading {topic} did not reach its end in {timeout:.0f}s")
            batches = await consumer.getmany(timeout_ms=500)
            for tp, messages in batches.items():
                out[tp.partition].extend(
                    Record(tp.partition, m.offset, m.key, m.value)
                    for m in messages
                    if m.offset < ends[tp]
                )
        return [r for p in sorted(out) for r in out[p]]
    finally:
        await consumer.stop()


@dataclass
class StreamProducer:
    """Produce payloads in the background at ``rate`` per second, surviving broker outages.

    A send that fails is retried (after a pause) until the broker takes it, so
    nothing the generator yields is skipped; such a retry may duplicate a
    payload in the topic, which is why checks read the topic back.
    """

    env: dict[str, str]
    payloads: Iterator[dict[str, Any]]
    rate: float = 50.0
    produced: int = 0
    retried: int = 0
    exhausted: bool = False
    _task: asyncio.Task[None] | None = field(default=None, repr=False)
    _stop: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    async def start(self) -> StreamProducer:
        settings = settings_for(self.env)
        await ensure_topics(settings)
        self._task = asyncio.create_task(self._run(settings), name="stream-producer")
        return self

    async def _send_acknowledged(
        self, producer: AIOKafkaProducer, topic: str, payload: dict[str, Any]
    ) -> None:
        value, key = orjson.dumps(payload), str(payload["session_id"]).encode()
        while True:
            try:
                fut = await producer.send(topic, value, key=key)
                await fut
                return
            except KafkaError as exc:
                self.retried += 1
                log.warning("produce failed (%s); retrying", exc)
                await asyncio.sleep(0.5)

    async def _run(self, settings: Settings) -> None:
        topic = settings.topic("actions")
        producer = _producer(settings.kafka_bootstrap_servers)
        await producer.start()
        try:
            started = time.monotonic()
            in_flight: list[asyncio.Task[None]] = []
            for payload in self.payloads:
                if self._stop.is_set():
                    break
                # Pace: the n-th payload goes out at n / rate seconds.
                delay = started + self.produced / self.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                # One session's payloads must keep their order: wait for the
                # previous sends before one may be retried out of order.
                in_flight.append(
                    asyncio.create_task(self._send_acknowledged(producer, topic, payload))
                )
                self.produced += 1
                if len(in_flight) >= 20:
                    await asyncio.gather(*in_flight)
                    in_flight.clear()
            await asyncio.gather(*in_flight)
            self.exhausted = not self._stop.is_set()
        finally:
            await producer.stop()

    async def wait(self, timeout: float = 300.0) -> None:
        """Until every payload was acknowledged (or ``stop()`` was called)."""
        assert self._task is not None
        await asyncio.wait_for(asyncio.shield(self._task), timeout)

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)

    @property
    def done(self) -> bool:
        return self._task is not None and self._task.done()


@asynccontextmanager
async def scratch_topic(bootstrap: str, prefix: str, partitions: int) -> AsyncIterator[str]:
    """A topic of its own for one test (``<prefix>-<random>``), deleted after it."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
        yield name
        await admin.delete_topics([name])
    finally:
        await admin.close()


async def delete_topics(env: dict[str, str]) -> int:
    """Delete the topics of one test (its prefix, and its apps' changelogs): a shared broker
    with thousands of leftover topics creates new ones slowly. Returns how many."""
    admin = AIOKafkaAdminClient(bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"])
    await admin.start()
    try:
        mine = [
            t
            for t in await admin.list_topics()
            if t.startswith(env["AC_TOPIC_PREFIX"]) or t.startswith(f"{env['AC_APP_ID']}-")
        ]
        if mine:
            await admin.delete_topics(mine)
        return len(mine)
    finally:
        await admin.close()


async def delete_topics_at_the_end(env: dict[str, str]) -> None:
    """``delete_topics`` in a test's teardown: bounded, and a failure is printed, not
    raised (the test's outcome is already known; only tidiness is at stake)."""
    try:
        await asyncio.wait_for(delete_topics(env), 30)
    except Exception as exc:
        print(f"[tests] topics of {env['AC_TOPIC_PREFIX']} not deleted: {exc!r}")


async def committed_offsets(env: dict[str, str], group: str, topic: str) -> dict[int, int]:
    """The offsets ``group`` has committed on ``topic`` (a topic name without the
    prefix), by partition; a partition without a commit is left out."""
    name = settings_for(env).topic(topic)
    admin = AIOKafkaAdminClient(bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"])
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == name}


async def uncommitted(
    env: dict[str, str], groups: Sequence[tuple[str, Sequence[str]]]
) -> dict[str, int]:
    """What each consumer group has not committed yet: for every partition of its input
    topics (names without the prefix), the log end offset minus the committed offset,
    where not 0. Empty: every group has processed, acknowledged and committed all of
    its input.

    Groups are checked in the order given, each group's commits read before the ends
    of its topics. Give the upstream group first (the pipeline, then the sinks): once
    it has committed everything, its output is complete (it is acknowledged by the
    broker before the input is), so the ends read next for the sinks are final.
    """
    settings = settings_for(env)
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        enable_auto_commit=False,
        isolation_level="read_committed",
    )
    await admin.start()
    await consumer.start()
    behind: dict[str, int] = {}
    try:
        for group, topics in groups:
            committed = await admin.list_consumer_group_offsets(group)
            tps = [
                TopicPartition(settings.topic(t), p)
                for t in topics
                for p in range(settings.partitions)
            ]
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                meta = committed.get(tp)
                done = meta.offset if meta is not None and meta.offset >= 0 else 0
                if ends[tp] - done:
                    behind[f"{group} {tp.topic}:{tp.partition}"] = ends[tp] - done
        return behind
    finally:
        await consumer.stop()
        await admin.close()
