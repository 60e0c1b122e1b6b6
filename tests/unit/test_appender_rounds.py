"""``Appender(max_wait_s=...)``: a record appended with ``may_wait`` (a changelog record
behind ``WriteBehind``) starts no round: it joins the next one another record starts, or
goes after ``max_wait_s`` (fewer produce requests at a steady rate)."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from aiokafka.cluster import ClusterMetadata

from streams._faust.appender import Appender
from streams.partitions import partition_of
from streams.settings import Settings
from tests.support.waiting import wait_for


class _Builder:
    def __init__(self) -> None:
        self.records: list[bytes] = []

    def append(self, key: bytes, value: bytes | None, timestamp: None) -> object:
        self.records.append(key)
        return self

    def close(self) -> None:
        pass


class _Producer:
    """One broker, one partition; every batch handed over kept with its delivery."""

    def __init__(self) -> None:
        cluster = SimpleNamespace(
            partitions_for_topic=lambda topic: {0},
            leader_for_partition=lambda tp: 1,
            add_listener=lambda listener: None,
        )
        self.client = SimpleNamespace(cluster=cluster)
        self.sent: list[tuple[list[bytes], asyncio.Future[Any]]] = []

    def create_batch(self) -> _Builder:
        return _Builder()

    async def send_batch(self, batch: _Builder, topic: str, *, partition: int) -> Any:
        delivery = asyncio.get_running_loop().create_future()
        self.sent.append((batch.records, delivery))
        return delivery

    def deliver(self) -> None:
        _, delivery = self.sent[-1]
        delivery.set_result(SimpleNamespace(topic="t", partition=0, offset=0, timestamp=0,
                                            timestamp_type=0, log_start_offset=0))  # fmt: skip


async def _first_round_done(max_wait_s: float) -> tuple[Appender, _Producer]:
    producer = _Producer()
    appender = Appender(lambda: producer, max_wait_s=max_wait_s)  # type: ignore[arg-type,return-value]
    appender.append_keyed("t", b"a", b"1")
    await wait_for(lambda: producer.sent, timeout=5)
    producer.deliver()  # the broker is free again
    return appender, producer


def _changelog(appender: Appender, key: bytes) -> asyncio.Future[Any]:
    return appender.append_all("changelog", 0, [(key, b"v")], then=lambda: None, may_wait=True)


async def _let_the_appender_run() -> None:
    for _ in range(10):  # ready callbacks and tasks run: the round's end, the appender
        await asyncio.sleep(0)


async def test_a_record_that_may_wait_goes_with_the_next_round_another_starts() -> None:
    # Each input took a round for its outputs, then one for its changelog: now the
    # changelog rides with the next input's outputs (docs/decisions.md).
    appender, producer = await _first_round_done(max_wait_s=30.0)
    _changelog(appender, b"w")
    await _let_the_appender_run()
    assert len(producer.sent) == 1  # a free broker, and still no round for it alone
    appender.append_keyed("t", b"b", b"2")
    await wait_for(lambda: len(producer.sent) == 3, timeout=5)
    assert sorted(records for records, _ in producer.sent[1:]) == [[b"b"], [b"w"]]


async def test_records_that_may_wait_go_together_once_the_first_has_waited() -> None:
    appender, producer = await _first_round_done(max_wait_s=0.2)
    appended_at = time.monotonic()
    _changelog(appender, b"w1")
    await _let_the_appender_run()
    _changelog(appender, b"w2")
    await wait_for(lambda: len(producer.sent) == 2, timeout=5)
    assert time.monotonic() - appended_at >= 0.2  # a timer, never before it is due
    assert producer.sent[1][0] == [b"w1", b"w2"]


async def test_a_record_that_may_not_wait_takes_a_free_broker_at_once() -> None:
    appender, producer = await _first_round_done(max_wait_s=30.0)
    appender.append_keyed("t", b"b", b"2")
    await wait_for(lambda: len(producer.sent) == 2, timeout=5)
    appender.append_keyed("t", b"c", b"3")  # waits for the broker's round
    producer.deliver()
    await wait_for(lambda: len(producer.sent) == 3, timeout=5)
    assert [records for records, _ in producer.sent] == [[b"a"], [b"b"], [b"c"]]


async def test_without_a_wait_a_record_that_may_wait_goes_at_once() -> None:
    appender, producer = await _first_round_done(max_wait_s=0.0)  # AC_CHANGELOG_ROUND_MS=0
    _changelog(appender, b"w")
    await wait_for(lambda: len(producer.sent) == 2, timeout=5)
    assert producer.sent[1][0] == [b"w"]


def test_the_wait_is_its_setting_or_the_inline_sinks_earlier_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AC_SINK_CHANGELOG_ROUND_MS", "5")  # before it covered every worker
    assert Settings().changelog_round_ms == 5
    monkeypatch.setenv("AC_CHANGELOG_ROUND_MS", "7")
    assert Settings().changelog_round_ms == 7


async def test_a_keyed_record_goes_by_the_partitions_of_the_latest_metadata() -> None:
    """The partitions a topic has are counted once per metadata update (aiokafka built a set
    per record to count them), and counted again after one, or for a new producer: a grown
    topic's keys move."""
    cluster = ClusterMetadata()
    cluster._partitions = {"t": dict.fromkeys(range(2))}
    producer = SimpleNamespace(client=SimpleNamespace(cluster=cluster))
    appender = Appender(lambda: producer)  # type: ignore[arg-type,return-value]
    keys = [b"k%d" % n for n in range(100)]
    key = next(k for k in keys if partition_of(k, 2) != partition_of(k, 8))
    appender.append_keyed("t", key, b"1")
    cluster._partitions = {"t": dict.fromkeys(range(8))}  # as an update builds them
    appender.append_keyed("t", key, b"2")  # no update seen yet: the count it had
    for listener in list(cluster._listeners):  # what ``update_metadata`` calls
        listener(cluster)
    appender.append_keyed("t", key, b"3")
    held = {partition: len(group.records) for (_, partition), group in appender._groups.items()}
    assert held == {partition_of(key, 2): 2, partition_of(key, 8): 1}
    restarted = ClusterMetadata()  # a new producer's metadata: counted afresh
    restarted._partitions = {"t": dict.fromkeys(range(2))}
    producer.client.cluster = restarted
    appender.append_keyed("t", key, b"5")
    assert len(appender._groups[("t", partition_of(key, 2))].records) == 3
    assert appender.append_keyed("u", key, b"4") is None  # no metadata for it yet
    cast(asyncio.Task[None], appender._task).cancel()  # its rounds are not this test's
