"""Records appended by partition and handed to the producer as whole batches.

aiokafka's ``send`` costs about 10 µs of CPU per record (an awaited metadata
check, a future and a metadata object per record, each resolved on delivery);
building a batch with ``create_batch`` and handing it over with ``send_batch``
costs about 3 µs per record (measured on this machine). The workers write two
to three changelog records per input record, so a :class:`Appender` collects
what is appended while the event loop is busy elsewhere and submits it as one
batch per partition: a round.

One round per broker is in flight at a time; what is appended for a broker
meanwhile waits for its round and goes as the next one. aiokafka sends a broker
one produce request at a time, with at most one batch per partition in it, and
takes a partition's next batch only once the one before is in a request.
Rounds handed over while one was in flight queued behind it and went out about
one batch per request (found with aiokafka's request timings on a backlog: 1.2
batches per request, hundreds of milliseconds per round trip). Holding them
costs no latency the producer would not have added, and a round carries
everything appended during the one before. (Waiting a fixed few milliseconds
for bigger batches cost more than it saved: a timer per round, and longer
waits for the sink's confirmations.)

A record appended with ``may_wait`` (a table's changelog record behind
``WriteBehind``: it gates only the acknowledgement of its input, never what an
agent reads) starts no round: it joins the next one another record starts, or
goes ``max_wait_s`` after it was appended. At a steady rate each input took a
round for its outputs, then one for its changelog; now the changelog rides with
the next input's outputs (docs/decisions.md).

Order per partition is kept: groups are submitted in the order they were
started, and aiokafka keeps one batch per partition in flight. All records of
a group share one acknowledgement, which resolves with the offset of the
group's *last* record when every batch of the group is in (so "everything up
to this offset is durable" holds for each of them). A record may carry a
``then`` callback: the group's callbacks run, in append order, once the broker
has the group and before its acknowledgement resolves.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.structs import RecordMetadata, TopicPartition

from streams.native import native
from streams.partitions import partition_of

__all__ = ["Appender"]

log = logging.getLogger(__name__)


class _Group:
    __slots__ = ("acknowledged", "eager", "records", "then")

    def __init__(self) -> None:
        self.eager = False  # holds a record that starts a round (else it waits for one)
        self.records: list[tuple[bytes, bytes | None]] = []
        self.then: list[Callable[[], object]] = []
        self.acknowledged: asyncio.Future[RecordMetadata] = (
            asyncio.get_running_loop().create_future()
        )


class Appender:
    """``append`` records to a topic partition; await what it returns for the broker's ack."""

    def __init__(
        self,
        producer: Callable[[], AIOKafkaProducer],
        *,
        max_wait_s: float = 0.0,
        batch_bytes: int | None = None,
    ) -> None:
        """``max_wait_s``: how long a ``may_wait`` record waits for a round to join.
        ``batch_bytes``: the producer's batch size, for batches built by the compiled
        builder (uncompressed, not transactional); None: by the producer's own builder."""
        self._producer = producer
        self.max_wait_s = max_wait_s
        self._batch_bytes = batch_bytes if native is not None else None
        self._groups: dict[tuple[str, int], _Group] = {}
        self._busy: set[int | None] = set()  # brokers (leader ids) with a round in flight
        self._waiting = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deadline: asyncio.TimerHandle | None = None  # the waiting records' round
        self._cluster: object = None  # the producer's metadata, which ``_partitions`` counts
        self._partitions: dict[str, int] = {}  # topic -> its partitions

    def append_keyed(
        self, topic: str, key: bytes, value: bytes | None
    ) -> asyncio.Future[RecordMetadata] | None:
        """``append`` to the partition the producer's default partitioner picks for ``key``;
        ``None`` while the producer has no metadata for ``topic`` (then use ``send``)."""
        count = self.partition_count(topic)
        if count is None:
            return None
        return self.append(topic, partition_of(key, count), key, value)

    def partition_count(self, topic: str) -> int | None:
        """``topic``'s partitions as the producer knows them; None while it has no metadata."""
        cluster = self._producer().client.cluster
        if cluster is not self._cluster:  # the first call, or a new producer's
            self._cluster, self._partitions = cluster, {}
            cluster.add_listener(self._metadata_updated)
        count = self._partitions.get(topic)
        if count is None:
            partitions = cluster.partitions_for_topic(topic)
            if not partitions:
                return None
            count = self._partitions[topic] = len(partitions)
        return count

    def _metadata_updated(self, cluster: object) -> None:
        # The counts are kept between updates: aiokafka built a set per record to count
        # them (1.3% of a pipeline by py-spy; test_appender_rounds.py, "partitions").
        if cluster is self._cluster:
            self._partitions.clear()

    def append(
        self,
        topic: str,
        partition: int,
        key: bytes,
        value: bytes | None,
        then: Callable[[], object] | None = None,
    ) -> asyncio.Future[RecordMetadata]:
        group = self._group(topic, partition)
        group.records.append((key, value))
        if then is not None:
            group.then.append(then)
        return group.acknowledged

    def append_run(
        self, topic: str, partition: int, records: list[tuple[bytes, bytes | None]]
    ) -> asyncio.Future[RecordMetadata]:
        """``append`` each of ``records`` in order."""
        group = self._group(topic, partition)
        group.records.extend(records)
        return group.acknowledged

    def append_all(
        self,
        topic: str,
        partition: int,
        records: list[tuple[bytes, bytes | None]],
        then: Callable[[], object],
        *,
        may_wait: bool = False,
    ) -> asyncio.Future[RecordMetadata]:
        """``append`` each of ``records`` in order, with one ``then`` after the last;
        ``may_wait``: they start no round (the module's docstring)."""
        group = self._group(topic, partition, may_wait=may_wait)
        group.records.extend(records)
        group.then.append(then)
        return group.acknowledged

    def _group(self, topic: str, partition: int, *, may_wait: bool = False) -> _Group:
        group = self._groups.get((topic, partition))
        if group is None:
            group = self._groups[(topic, partition)] = _Group()
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._submit_forever(), name="appender")
        if not group.eager:
            if not may_wait or self.max_wait_s <= 0:
                group.eager = True
                self._waiting.set()
            elif self._deadline is None:
                loop = asyncio.get_running_loop()
                self._deadline = loop.call_later(self.max_wait_s, self._waited_enough)
        return group

    def _waited_enough(self) -> None:
        self._deadline = None
        for group in self._groups.values():
            group.eager = True
        self._waiting.set()

    async def _submit_forever(self) -> None:
        while True:
            # Woken by a record that starts a round, the end of a wait or of a round; this
            # runs after the tasks already ready (what they append joins the round).
            await self._waiting.wait()
            self._waiting.clear()
            by_broker: dict[int | None, dict[tuple[str, int], _Group]] = {}
            for slot in list(self._groups):  # the waiting records too: they join the round
                broker = self._leader(slot)
                if broker not in self._busy:  # else it waits for that broker's round
                    by_broker.setdefault(broker, {})[slot] = self._groups.pop(slot)
            if not self._groups and self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None
            for broker, groups in by_broker.items():
                if deliveries := await self._submit_round(groups):
                    self._busy.add(broker)
                    _when_all_done(deliveries, functools.partial(self._round_done, broker))

    def _leader(self, slot: tuple[str, int]) -> int | None:
        leader = self._producer().client.cluster.leader_for_partition(TopicPartition(*slot))
        return leader if leader is not None and leader >= 0 else None

    def _round_done(self, broker: int | None) -> None:
        self._busy.discard(broker)
        if any(group.eager for group in self._groups.values()):
            self._waiting.set()  # what was appended meanwhile goes now

    async def _submit_round(self, groups: dict[tuple[str, int], _Group]) -> list[Any]:
        """Hand every group's batches to the producer, first batches first; returns
        each group's last delivery.

        The producer takes a partition's next batch only once the one before is in
        a request, and sends a broker one request at a time: a group's second batch
        handed over before the other groups' first would go out alone.
        """
        producer = self._producer()
        if self._batch_bytes is None:
            built = {slot: _batches(producer, group) for slot, group in groups.items()}
        else:
            built = _built_batches(groups, self._batch_bytes)
        sent: dict[tuple[str, int], list[asyncio.Future[Any]]] = {slot: [] for slot in built}
        failed: set[tuple[str, int]] = set()
        for layer in range(max(len(batches) for batches in built.values())):
            for slot, batches in built.items():
                if layer >= len(batches) or slot in failed:
                    continue
                topic, partition = slot
                try:
                    delivery = await producer.send_batch(
                        batches[layer][0], topic, partition=partition
                    )
                except Exception as exc:  # whoever awaits the group sees it (and stops)
                    log.warning("appending to %s[%d] failed: %r", topic, partition, exc)
                    failed.add(slot)
                    if not groups[slot].acknowledged.done():
                        groups[slot].acknowledged.set_exception(exc)
                    continue
                sent[slot].append(delivery)
        last_deliveries = []
        for slot in built.keys() - failed:
            group, deliveries, in_last = groups[slot], sent[slot], built[slot][-1][1]
            deliveries[-1].add_done_callback(
                functools.partial(_acknowledge, group, deliveries, in_last)
            )
            last_deliveries.append(deliveries[-1])
        return last_deliveries


def _when_all_done(futures: list[asyncio.Future[Any]], callback: Callable[[], None]) -> None:
    remaining = len(futures)

    def one_done(_: asyncio.Future[Any]) -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            callback()

    for future in futures:
        future.add_done_callback(one_done)


def _batches(producer: AIOKafkaProducer, group: _Group) -> list[tuple[Any, int]]:
    """The group's records in closed batches, each with its number of records."""
    out = []
    builder, in_builder = producer.create_batch(), 0
    for key, value in group.records:
        if builder.append(key=key, value=value, timestamp=None) is None:  # full
            builder.close()
            out.append((builder, in_builder))
            builder, in_builder = producer.create_batch(), 0
            builder.append(key=key, value=value, timestamp=None)  # a first one always fits
        in_builder += 1
    builder.close()  # nothing else joins it (``send`` may add to an open batch)
    out.append((builder, in_builder))
    return out


def _built_batches(
    groups: dict[tuple[str, int], _Group], batch_bytes: int
) -> dict[tuple[str, int], list[tuple[Any, int]]]:
    """``_batches`` for each group, built whole by ``native.record_batches``: the same bytes
    at ~0.1 against ~0.9 µs a record (tests/unit/test_record_batches.py), every record of
    the round at one timestamp."""
    build, now = native.record_batches, int(time.time() * 1000)  # type: ignore[union-attr]
    return {
        slot: [(batch, batch.record_count()) for batch in build(group.records, batch_bytes, now)]
        for slot, group in groups.items()
    }


def _acknowledge(
    group: _Group, sent: list[asyncio.Future[Any]], in_last: int, _: object = None
) -> None:
    """The group's last batch is done, so each before it is (one in flight per partition)."""
    if group.acknowledged.done():
        return
    for batch in sent:
        if batch.cancelled() or not batch.done():
            group.acknowledged.set_exception(RuntimeError("a batch was not acknowledged"))
            return
        if (error := batch.exception()) is not None:
            group.acknowledged.set_exception(error)
            return
    try:
        for then in group.then:
            then()
    except Exception as exc:
        group.acknowledged.set_exception(exc)
        return
    last: RecordMetadata = sent[-1].result()
    group.acknowledged.set_result(
        RecordMetadata(
            last.topic,
            last.partition,
            TopicPartition(last.topic, last.partition),
            last.offset + in_last - 1,  # the batch's base offset + its records
            last.timestamp,
            last.timestamp_type,
            last.log_start_offset,
        )
    )
