"""``Appender(min_round_s=...)``: records appended within the interval after a round go
out together in the next one (an inline sink's changelog: fewer produce requests)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from streams._faust.appender import Appender
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
            partitions_for_topic=lambda topic: {0}, leader_for_partition=lambda tp: 1
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


async def _first_round_done(min_round_s: float) -> tuple[Appender, _Producer]:
    producer = _Producer()
    appender = Appender(lambda: producer, min_round_s=min_round_s)  # type: ignore[arg-type,return-value]
    appender.append_keyed("t", b"a", b"1")
    await wait_for(lambda: producer.sent, timeout=5)
    producer.deliver()  # the broker is free again
    return appender, producer


async def test_records_appended_within_the_interval_share_the_next_round() -> None:
    appender, producer = await _first_round_done(min_round_s=0.3)
    appender.append_keyed("t", b"b", b"2")
    for _ in range(10):  # the appender runs, and waits out the interval
        await asyncio.sleep(0)
    appender.append_keyed("t", b"c", b"3")
    await wait_for(lambda: len(producer.sent) == 2, timeout=5)
    assert [records for records, _ in producer.sent] == [[b"a"], [b"b", b"c"]]


async def test_without_an_interval_a_free_broker_takes_a_record_at_once() -> None:
    appender, producer = await _first_round_done(min_round_s=0.0)
    appender.append_keyed("t", b"b", b"2")
    await wait_for(lambda: len(producer.sent) == 2, timeout=5)
    appender.append_keyed("t", b"c", b"3")  # waits for the broker's round
    producer.deliver()
    await wait_for(lambda: len(producer.sent) == 3, timeout=5)
    assert [records for records, _ in producer.sent] == [[b"a"], [b"b"], [b"c"]]
