"""The rows of `python -m scripts.bench.clients`, each run alone in a fresh process.

    python -m scripts.bench.client_rows <row> '<json: bootstrap, topic, partitions, records, ...>'

prints one ``CLIENTROW {"records": n, "wall_s": s, "cpu_s": s}`` line. CPU is the
process's (``getrusage``: every thread, so librdkafka's too), from before the client is
made to the last record taken or acknowledged; module imports are left out.
"""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from scripts.bench.workload import paced
from streams._faust.appender import Appender
from streams.partitions import partition_of
from streams.topics import DEAD_LETTER_MAX_BYTES

CHUNK = 500  # records taken or appended per turn of the loop (a BatchSource batch)
IN_FLIGHT = 10_000  # records produced and not yet acknowledged, at most


def cpu_now() -> float:
    """User + system CPU seconds of this process so far, all its threads included."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def load_records(path: str) -> list[tuple[bytes, bytes]]:
    """(key, value) pairs from a file of JSON payloads, one a line, keyed by session."""
    lines = Path(path).read_bytes().splitlines()
    return [(orjson.loads(line)["session_id"].encode(), line) for line in lines]


def _end(cfg: dict[str, Any], records: int) -> int:
    """The window ends here, before the client is closed."""
    cfg["end"] = (time.perf_counter(), cpu_now())
    return records


def _rdkafka_common(cfg: dict[str, Any]) -> dict[str, Any]:
    return {"bootstrap.servers": cfg["bootstrap"], "client.id": "perf-clients"}


# consume: read the whole topic from its beginning, touching every record's value


async def consume_aiokafka(cfg: dict[str, Any]) -> int:
    """aiokafka's ``getmany`` as Faust's consumer calls it for our BatchSource (Faust's
    fetch settings: 1 MiB per partition, 1.5 s fetch wait, CRCs checked, no record cap)."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=cfg["bootstrap"],
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=1024**2,
        fetch_max_wait_ms=1500,
        check_crcs=True,
    )
    await consumer.start()
    try:
        consumer.assign([TopicPartition(cfg["topic"], p) for p in range(cfg["partitions"])])
        await consumer.seek_to_beginning()
        seen, touched = 0, 0
        while seen < cfg["records"]:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                seen += len(records)
                touched += sum(len(r.value or b"") for r in records)
        return _end(cfg, seen)
    finally:
        await consumer.stop()


def _rdkafka_consumer(cfg: dict[str, Any]) -> Any:
    from confluent_kafka import OFFSET_BEGINNING, Consumer
    from confluent_kafka import TopicPartition as RdPartition

    consumer = Consumer(
        {
            **_rdkafka_common(cfg),
            "group.id": cfg["group"],  # required; assign() below joins no group
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "max.partition.fetch.bytes": 1024**2,
            "check.crcs": True,  # as aiokafka above
        }
    )
    consumer.assign(
        [RdPartition(cfg["topic"], p, OFFSET_BEGINNING) for p in range(cfg["partitions"])]
    )
    return consumer


def _take(messages: list[Any]) -> int:
    touched = 0
    for message in messages:
        if message.error() is not None:
            raise RuntimeError(f"consume: {message.error()}")
        touched += len(message.value() or b"")
    return touched


async def _drain(cfg: dict[str, Any], fetch: Callable[[Any, int], Awaitable[list[Any]]]) -> int:
    consumer, seen = _rdkafka_consumer(cfg), 0
    try:
        while seen < cfg["records"]:
            # Never more than remain: a call short of its count waits out its timeout.
            messages = await fetch(consumer, min(CHUNK, cfg["records"] - seen))
            _take(messages)
            seen += len(messages)
        return _end(cfg, seen)
    finally:
        consumer.close()


async def consume_rdkafka(cfg: dict[str, Any]) -> int:
    """confluent-kafka's ``consume(num_messages=500)``, blocking: the loop does nothing else."""

    async def blocking(consumer: Any, wanted: int) -> list[Any]:
        return list(consumer.consume(wanted, timeout=1.0))

    return await _drain(cfg, blocking)


async def consume_rdkafka_loop(cfg: dict[str, Any]) -> int:
    """The same, polled by the asyncio loop as a worker would: ``consume(timeout=0)``
    each turn, a 5 ms sleep when nothing is there (the loop must not block)."""

    async def polled(consumer: Any, wanted: int) -> list[Any]:
        messages = list(consumer.consume(wanted, timeout=0))
        await asyncio.sleep(0 if messages else 0.005)
        return messages

    return await _drain(cfg, polled)


async def consume_rdkafka_thread(cfg: dict[str, Any]) -> int:
    """The same, the blocking ``consume`` in an executor thread the loop awaits."""
    loop = asyncio.get_running_loop()

    async def threaded(consumer: Any, wanted: int) -> list[Any]:
        return list(await loop.run_in_executor(None, consumer.consume, wanted, 1.0))

    return await _drain(cfg, threaded)


# produce: every record to its key's partition, acks=all, idempotent, linger 5 ms


async def _chunks(cfg: dict[str, Any]) -> AsyncIterator[list[tuple[bytes, bytes]]]:
    """The records in turns of CHUNK, or with ``cfg["rate"]`` (records/s) each 2 ms tick's
    due records, as ``--mode latency`` offers them."""
    records, rate = cfg["data"], cfg.get("rate", 0)
    if not rate:
        for start in range(0, len(records), CHUNK):
            yield records[start : start + CHUNK]
        return
    async for due in paced(len(records), rate):
        yield records[due.start : due.stop]


async def produce_aiokafka(cfg: dict[str, Any]) -> int:
    """Our workers' path: ``streams._faust.appender.Appender`` over an aiokafka producer
    set up as theirs (streams/_faust/app_base.py, streams/app.py)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=cfg["bootstrap"],
        acks="all",
        enable_idempotence=True,
        linger_ms=5,
        max_batch_size=256 * 1024,
        max_request_size=DEAD_LETTER_MAX_BYTES,
    )
    await producer.start()
    try:
        appender, topic, partitions = Appender(lambda: producer), cfg["topic"], cfg["partitions"]
        in_flight: deque[tuple[asyncio.Future[Any], int]] = deque()
        pending = 0
        records = cfg["data"]
        async for chunk in _chunks(cfg):
            counts: dict[asyncio.Future[Any], int] = {}
            for key, value in chunk:
                ack = appender.append(topic, partition_of(key, partitions), key, value)
                counts[ack] = counts.get(ack, 0) + 1
            in_flight.extend(counts.items())
            pending += sum(counts.values())
            await asyncio.sleep(0)  # the appender's round goes out meanwhile
            while pending > IN_FLIGHT:
                ack, n = in_flight.popleft()
                await ack
                pending -= n
        await asyncio.gather(*(ack for ack, _ in in_flight))
        return _end(cfg, len(records))
    finally:
        await producer.stop()


async def produce_rdkafka(cfg: dict[str, Any], *, per_record: bool = True) -> int:
    """confluent-kafka's ``produce`` from the asyncio loop with the same settings, the
    delivery reports served by ``poll(0)`` each turn; every acknowledgement awaited.
    ``per_record``: a delivery callback on each record, else only on each turn's last
    record per partition (in order and idempotent, it vouches for those before it)."""
    from confluent_kafka import Producer

    producer = Producer(
        {
            **_rdkafka_common(cfg),
            "acks": "all",
            "enable.idempotence": True,
            "linger.ms": 5,
            "batch.size": 256 * 1024,
            "message.max.bytes": DEAD_LETTER_MAX_BYTES,
        }
    )
    topic, partitions = cfg["topic"], cfg["partitions"]
    acknowledged, errors = 0, []

    def delivered(covers: int) -> Callable[[Any, Any], None]:
        def report(error: Any, _: Any) -> None:
            nonlocal acknowledged
            if error is not None:
                errors.append(error)
            acknowledged += covers

        return report

    one, sent = delivered(1), 0
    async for chunk in _chunks(cfg):
        parts = [partition_of(key, partitions) for key, _ in chunk]
        reports: list[Any] = (
            [one] * len(chunk) if per_record else _last_per_partition(parts, delivered)
        )
        for (key, value), partition, report in zip(chunk, parts, reports, strict=True):
            _produce(producer, topic, partition, key, value, report)
        sent += len(chunk)
        producer.poll(0)
        await asyncio.sleep(0)
        while sent - acknowledged > IN_FLIGHT:
            if not producer.poll(0):
                await asyncio.sleep(0.001)
    while acknowledged < sent:
        if not producer.poll(0):
            await asyncio.sleep(0.001)
    if errors:
        raise RuntimeError(f"produce: {errors[0]}")
    return _end(cfg, sent)


async def produce_rdkafka_grouped(cfg: dict[str, Any]) -> int:
    return await produce_rdkafka(cfg, per_record=False)


def _last_per_partition(
    parts: list[int], delivered: Callable[[int], Callable[[Any, Any], None]]
) -> list[Any]:
    """A report on each partition's last record only, covering that partition's records."""
    reports: list[Any] = [None] * len(parts)
    counts, done = Counter(parts), set()
    for i in reversed(range(len(parts))):
        if parts[i] not in done:
            done.add(parts[i])
            reports[i] = delivered(counts[parts[i]])
    return reports


def _produce(
    producer: Any, topic: str, partition: int, key: bytes, value: bytes, report: Any
) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition=partition, on_delivery=report)
            return
        except BufferError:  # librdkafka's queue is full: serve its reports, then retry
            producer.poll(0.005)


ROWS: dict[str, Callable[[dict[str, Any]], Awaitable[int]]] = {
    "consume-aiokafka": consume_aiokafka,
    "consume-rdkafka": consume_rdkafka,
    "consume-rdkafka-loop": consume_rdkafka_loop,
    "consume-rdkafka-thread": consume_rdkafka_thread,
    "produce-aiokafka": produce_aiokafka,
    "produce-rdkafka": produce_rdkafka,
    "produce-rdkafka-grouped": produce_rdkafka_grouped,
}


async def run(row: str, cfg: dict[str, Any]) -> dict[str, Any]:
    if "records_file" in cfg:  # loaded before the window
        cfg["data"] = load_records(cfg["records_file"])
    start, cpu_start = time.perf_counter(), cpu_now()
    records = await ROWS[row](cfg)
    end, cpu_end = cfg["end"]
    return {"records": records, "wall_s": end - start, "cpu_s": cpu_end - cpu_start}


def main() -> None:
    row, cfg = sys.argv[1], orjson.loads(sys.argv[2])
    print("CLIENTROW " + orjson.dumps(asyncio.run(run(row, cfg))).decode(), flush=True)


if __name__ == "__main__":
    main()
