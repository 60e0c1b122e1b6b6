"""The workload every mode measures, and the load generator that offers it."""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from streams.native import native
from streams.partitions import partition_of


def bench_parser(prog: str, description: str | None) -> argparse.ArgumentParser:
    """A bench command's parser, with the broker and the workload as every one takes them."""
    parse = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parse.add_argument
    add("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    add("--actions", type=int, default=200_000)
    add("--sessions", type=int, default=5_000)
    add("--max-batch", type=int, default=3)
    add("--partitions", type=int, default=8)
    add("--seed", type=int, default=1)
    add("--ids", action="store_true",
        help="every action with a URL and a description that carry ids, as a real app's do "
        "(numbers of 4-9 digits, UUIDs): text the PII filter's cache cannot serve")  # fmt: skip
    return parse


def url_with_ids(rng: random.Random) -> str:
    """A page's URL as a real app writes it: project and task numbers, a document's UUID,
    an order number, or none."""
    kind = rng.random()
    if kind < 0.4:
        project, task = rng.randrange(10**5), rng.randrange(10**4)
        return f"https://app.example.com/projects/{project}/tasks/{task}?tab=board"
    if kind < 0.7:
        return f"https://app.example.com/docs/{uuid.UUID(int=rng.getrandbits(128))}/edit"
    if kind < 0.9:
        return f"https://app.example.com/orders/{rng.randrange(10**7, 10**9)}"
    return "https://app.example.com/settings"


def with_ids(action: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """``action`` with a URL and a description that carry ids, as a real app's do."""
    url = url_with_ids(rng)
    return {**action, "raw_url": url, "description": f"Opened item {rng.randrange(10**4)}"}


def workload(
    actions: int,
    sessions: int,
    seed: int,
    *,
    min_batch: int,
    max_batch: int,
    stamp: bool = False,
    ids: bool = False,
) -> list[dict[str, Any]]:
    """Interleaved batches of 1-3 actions over `sessions` sessions, `actions` in total;
    ``ids``: their URLs and descriptions carry ids (:func:`url_with_ids`)."""
    rng = random.Random(seed)
    ids_rng = random.Random(seed + 7)
    per_session = [actions // sessions] * sessions
    next_index = [0] * sessions
    payloads: list[dict[str, Any]] = []
    live = list(range(sessions))
    while live:
        i = rng.choice(live)
        n = min(rng.randint(min_batch, max_batch), per_session[i] - next_index[i])
        sid = f"bench-{seed}-{i:05d}"
        acts = [
            {
                "index": next_index[i] + j,
                "type": "click",
                "title": f"Button {j}",
                "description": f"User clicked button {j} on the page",
                "canonical_url": "https://app.example.com/projects/:id",
                "timestamp_start": 0.0,
                "timestamp_end": 0.0,
                "session_id": sid,
            }
            for j in range(n)
        ]
        if ids:
            acts = [with_ids(act, ids_rng) for act in acts]
        next_index[i] += n
        payloads.append(
            {
                "type": "actions",
                "product_id": "bench",
                "session_id": sid,
                "actions": acts,
                "count": n,
                "forwarded_at": 0.0,
            }
        )
        if next_index[i] >= per_session[i]:
            live.remove(i)
    # Millions of objects that live to the end: out of the cyclic GC's scans, or a full
    # collection pauses the load generator for up to 130 ms mid-measurement (found
    # with a gc.callbacks probe), and the workers are charged for the burst after it.
    gc.freeze()
    return payloads


def idle_sessions(sessions: int, seed: int) -> list[dict[str, Any]]:
    """One payload of 2 actions per session (under K: nothing to summarise), in O(n)."""
    template = workload(2, 1, seed, min_batch=2, max_batch=2)[0]
    out = []
    for i in range(sessions):
        sid = f"idle-{seed}-{i:07d}"
        actions = [{**a, "session_id": sid} for a in template["actions"]]
        out.append({**template, "session_id": sid, "actions": actions})
    return out


PACING_TICK_S = 0.002


async def produce(
    bootstrap: str,
    topic: str,
    payloads: list[dict[str, Any]],
    rate: float | None = None,
    tick_s: float = PACING_TICK_S,
    client: str = "aiokafka",
) -> None:
    if rate is None:
        return await produce_records(bootstrap, topic, backlog(payloads))
    if client == "rdkafka":
        return await _produce_paced_rdkafka(bootstrap, topic, payloads, rate, tick_s)
    producer = _producer(bootstrap)
    await producer.start()
    try:
        await asyncio.gather(*await _produce_paced(producer, topic, payloads, rate, tick_s))
    finally:
        await producer.stop()


def backlog(payloads: list[dict[str, Any]]) -> list[tuple[bytes, bytes]]:
    """The payloads as a client's records (key: the session id), encoded before a window
    opens, as (b) is given its payloads' bytes (``bench_sdk``)."""
    return [(p["session_id"].encode(), orjson.dumps(p)) for p in payloads]


_BATCH_BYTES = 256 * 1024


def _producer(bootstrap: str) -> AIOKafkaProducer:
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, acks="all", max_batch_size=_BATCH_BYTES
    )


async def produce_records(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    """``(key, value)`` records to ``topic`` as fast as the producer goes, each on its key's
    partition (Kafka's default partitioner), in whole batches (:func:`_send_batches`): with a
    ``send`` per record the backlog's producer took 24.9 µs of CPU a payload, most of a core
    for the first half of an end-to-end run, on the cores the workers it measures share
    (docs/performance.md, session 37)."""
    producer = _producer(bootstrap)
    await producer.start()
    try:
        partitions = len(await producer.partitions_for(topic))
        futures = []
        placed = _by_partition(
            (partition_of(key, partitions), key, value) for key, value in records
        )
        for partition, them in placed.items():
            futures += await _send_batches(producer, topic, {partition: them})
            await asyncio.sleep(0)  # the sender goes on with what is handed over
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


def _by_partition(
    records: Iterable[tuple[int, bytes, bytes]],
) -> dict[int, list[tuple[bytes, bytes]]]:
    placed: dict[int, list[tuple[bytes, bytes]]] = {}
    for partition, key, value in records:
        placed.setdefault(partition, []).append((key, value))
    return placed


async def _send_batches(
    producer: AIOKafkaProducer, topic: str, placed: dict[int, list[tuple[bytes, bytes]]]
) -> list[asyncio.Future[Any]]:
    """Each partition's records as whole batches, closed and handed over (an open one
    lingers in the producer, ``linger_ms``: up to 5 ms on every action's measured latency).
    Built by ``native.record_batches`` where built, the workers' own batch writer: aiokafka's
    builder, ~0.9 µs a record in Python, kept the workers waiting ~0.5 s for the backlog's
    first batch while it built them all (session 41, docs/performance.md)."""
    futures: list[asyncio.Future[Any]] = []
    now = int(time.time() * 1000)
    for partition, records in placed.items():
        if native is not None:
            batches = native.record_batches(records, _BATCH_BYTES, now)
        else:
            batches = _built(producer, records)
        for batch in batches:
            futures.append(await producer.send_batch(batch, topic, partition=partition))
    return futures


def _built(producer: AIOKafkaProducer, records: list[tuple[bytes, bytes]]) -> list[Any]:
    batches, batch = [], producer.create_batch()
    for key, value in records:
        if batch.append(key=key, value=value, timestamp=None) is None:
            batch.close()
            batches.append(batch)
            batch = producer.create_batch()
            batch.append(key=key, value=value, timestamp=None)
    batch.close()
    return [*batches, batch]


async def _produce_paced(
    producer: AIOKafkaProducer,
    topic: str,
    payloads: list[dict[str, Any]],
    rate: float,
    tick_s: float = PACING_TICK_S,
) -> list[asyncio.Future[Any]]:
    """Offer ``payloads`` at ``rate``, in ticks of ``tick_s``: each tick's payloads go out as
    one batch per partition (:func:`_stamped_ticks`). The generator shares the two cores
    with what it measures; a timer per payload took a quarter of one at 5,000 actions/s,
    a ``send`` per payload still a sixth. (Not ``streams._faust.appender``: with its per-round acknowledgements the
    generator took 20% of a core against 12% with this loop.)"""
    partitions = len(await producer.partitions_for(topic))
    futures: list[asyncio.Future[Any]] = []
    async for tick in _stamped_ticks(payloads, rate, tick_s, partitions):
        futures += await _send_batches(producer, topic, _by_partition(tick))
    return futures


async def _stamped_ticks(
    payloads: list[dict[str, Any]], rate: float, tick_s: float, partitions: int
) -> AsyncIterator[list[tuple[int, bytes, bytes]]]:
    """Each tick's due payloads as (partition, key, value), the partition the default
    partitioner's, each action stamped with its payload's due time (latency starts there:
    a tick's wait counts)."""
    wall_start = time.time()
    async for due in paced(len(payloads), rate, tick_s):
        tick = []
        for i, p in zip(due, payloads[due.start : due.stop], strict=True):
            happened = wall_start + i / rate  # when the generator owed it
            for a in p["actions"]:
                a["timestamp_end"] = happened
            key = p["session_id"].encode()
            tick.append((partition_of(key, partitions), key, orjson.dumps(p)))
        yield tick


async def _produce_paced_rdkafka(
    bootstrap: str, topic: str, payloads: list[dict[str, Any]], rate: float, tick_s: float
) -> None:
    """``_produce_paced`` on librdkafka (confluent-kafka, the ``bench`` extra): each tick's
    payloads handed to its queue, then ``flush(0)``, which sends what lingers at once: one
    request per tick, as the aiokafka generator's closed batches (with ``linger.ms`` 0 its
    requests were smaller and more, and the broker spent 12% of a core more)."""
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 50, "batch.size": 256 * 1024}
    )
    partitions = len(producer.list_topics(topic, timeout=10).topics[topic].partitions)
    async for tick in _stamped_ticks(payloads, rate, tick_s, partitions):
        for partition, key, value in tick:
            while True:
                try:
                    producer.produce(topic, value, key, partition=partition)
                    break
                except BufferError:  # its queue is full: serve its reports, then retry
                    producer.poll(0.005)
        producer.flush(0)
    if left := await asyncio.to_thread(producer.flush, 60):
        raise RuntimeError(f"the load generator could not deliver {left} payloads in 60 s")


async def paced(count: int, rate: float, tick_s: float = PACING_TICK_S) -> AsyncIterator[range]:
    """The indices of ``count`` items offered at ``rate`` a second: every tick (at least
    ``tick_s`` apart, none while behind), the range of those now due."""
    start, sent = time.perf_counter(), 0
    while sent < count:
        if (delay := start + sent / rate - time.perf_counter()) > 0:
            await asyncio.sleep(max(delay, tick_s))
        due = min(count, int((time.perf_counter() - start) * rate) + 1)
        yield range(sent, due)
        sent = due


async def changelog_records(bootstrap: str, app_id: str) -> int:
    """How many records the changelogs of ``app_id``'s workers hold (compaction aside)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        cluster = await consumer._client.fetch_all_metadata()
        topics = [t for t in cluster.topics() if t.startswith(app_id) and "changelog" in t]
        parts = [TopicPartition(t, p) for t in topics for p in cluster.partitions_for_topic(t)]
        return sum((await consumer.end_offsets(parts)).values()) if parts else 0
    finally:
        await consumer.stop()


async def records_in(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records ``topic`` holds (the sum of its partitions' end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return sum(ends.values())
    finally:
        await consumer.stop()
