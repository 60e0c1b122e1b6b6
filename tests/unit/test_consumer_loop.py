"""Where Faust's Kafka consumer runs (streams/_faust/consumer.py).

Every integration test consumes through the default; these pin the wiring."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from streams.app import create_app
from streams.settings import Settings


async def test_the_kafka_consumer_runs_on_the_workers_event_loop(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    consumer_service = app.consumer._thread  # Faust's name: a thread, by default
    assert consumer_service.thread_loop is asyncio.get_running_loop()


async def test_consumer_thread_setting_keeps_fausts_own_thread(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, consumer_thread=True), role="pipeline")
    consumer_service = app.consumer._thread
    try:
        assert consumer_service.thread_loop is not asyncio.get_running_loop()
    finally:
        consumer_service.thread_loop.close()  # made for the thread, which never started


async def test_consumer_calls_are_plain_awaits(tmp_path: Path) -> None:
    """A fetch or commit runs in the caller's task, not through Faust's method queue
    (on one loop the queue only added a self-pipe wake-up each way and three tasks)."""
    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    consumer_service = app.consumer._thread
    ran_in: list[asyncio.Task[Any] | None] = []

    async def fetch(value: int) -> int:
        ran_in.append(asyncio.current_task())
        return value + 1

    caller = asyncio.ensure_future(consumer_service.call_thread(fetch, 41))
    done, _ = await asyncio.wait([caller], timeout=5)  # queued, it would wait for a worker
    assert caller in done and caller.result() == 42
    assert ran_in == [caller]
    assert consumer_service.method_queue._queue.empty()


async def test_the_fetch_loops_yield_is_a_plain_yield(tmp_path: Path) -> None:
    """``sleep(0)``, which Faust's fetch loop calls before each fetch, yields once; it does
    not wait on the stop event (mode's version: a task made and cancelled each round)."""
    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    consumer = app.consumer
    waited: list[str] = []
    real_wait = consumer._stopped.wait

    def stopped_wait() -> Coroutine[Any, Any, Any]:
        waited.append("stopped")
        return real_wait()

    consumer._stopped.wait = stopped_wait  # type: ignore[method-assign]
    await consumer.sleep(0)
    assert waited == []
    await consumer.sleep(0.001)  # a real sleep still ends early when the consumer stops
    assert waited == ["stopped"]


def _messages(topic: str) -> list[Any]:
    """A partition's records as Faust's driver makes them, one offset twice (a re-fetch)."""
    from faust.types import TP, ConsumerMessage

    tp = TP(topic, 0)
    offsets = [3, 4, 5, 5, 6, 9]
    return [ConsumerMessage(topic, 0, o, 0.0, 0, None, b"k", b"v", None, 1, 1, tp) for o in offsets]


async def test_acks_in_bulk_leave_the_consumer_as_faust_s_own_acks_do(tmp_path: Path) -> None:
    """``ack_all`` against Faust's ``Consumer.ack`` one record at a time: the same acked
    offsets, count, records no longer pending, flags; offsets below the commit ignored."""
    from faust.types import TP

    from streams._faust.consumer import ack_all

    states = []
    for bulk in (False, True):
        app = create_app(Settings(data_dir=tmp_path / str(bulk)), role="pipeline")
        app.topics._acking_topics.add("t.acked")
        consumer = app.consumer
        consumer._committed_offset[TP("t.acked", 0)] = 4
        acked, unacked = _messages("t.acked"), _messages("t.unacked")
        for message in acked + unacked:
            consumer.track_message(message)
        acked[-1].acked = True  # acknowledged before
        if bulk:
            counted = ack_all(consumer, acked + unacked)
        else:
            counted = sum(map(consumer.ack, acked + unacked))
        states.append(
            (
                counted,
                dict(consumer._acked),
                {tp: sorted(index) for tp, index in consumer._acked_index.items()},
                consumer._n_acked,
                sorted(m.offset for m in consumer._unacked_messages if m.topic == "t.acked"),
                [m.acked for m in acked + unacked],
            )
        )
    faust_s, ours = states
    assert ours == faust_s
    assert faust_s[0] == 3  # 4, 5, 6: 3 is below the commit, 9 was acked, 5 comes twice


async def test_a_fetch_takes_at_most_the_configured_bytes_per_partition(tmp_path: Path) -> None:
    """A partition's fetched records are decoded and buffered together (divert's bulk take):
    at Faust's 1 MiB a backlog's worker held ~40 MiB more (docs/performance.md). A record
    over the size still arrives (test_reliability.py: 900 kB records through the pipeline)."""
    loop = asyncio.get_running_loop()
    for settings, expected in (
        (Settings(data_dir=tmp_path), 256 * 1024),
        (Settings(data_dir=tmp_path, fetch_partition_bytes=64 * 1024), 64 * 1024),
    ):
        app = create_app(settings, role="pipeline")
        kafka_consumer = app.consumer._thread._create_consumer(loop)
        assert kafka_consumer._max_partition_fetch_bytes == expected


async def test_a_fetch_after_records_waits_at_the_broker_one_after_none_as_before() -> None:
    """Faust's fetch (1 byte, up to 1,500 ms) made each arrival a round of the worker's at a
    steady rate (2.5x its CPU at 5,000 actions/s, docs/decisions.md); the settings' wait
    alone polled an idle worker every 10 ms. Each next request is built from these."""
    from streams._faust.consumer import wait_while_busy

    brought = iter([True, True, False, True, False])

    async def proc_fetch_request(assignment: Any, node_id: int, request: Any) -> bool:
        return next(brought)

    fetcher = SimpleNamespace(
        _fetch_min_bytes=1, _fetch_max_wait_ms=1500, _proc_fetch_request=proc_fetch_request
    )
    wait_while_busy(fetcher, (64 * 1024, 10))
    waits = []
    for _ in range(5):
        await fetcher._proc_fetch_request(None, 0, None)
        waits.append((fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms))
    busy, idle = (64 * 1024, 10), (1, 1500)
    assert waits == [busy, busy, idle, busy, idle]


def test_the_fetch_wait_is_the_settings(tmp_path: Path) -> None:
    for settings, expected in (
        (Settings(data_dir=tmp_path), (64 * 1024, 10)),
        (Settings(data_dir=tmp_path, fetch_min_bytes=1, fetch_max_wait_ms=500), (1, 500)),
    ):
        assert create_app(settings, role="sink-null").fetch_wait() == expected


async def test_a_sources_records_are_tracked_past_fausts_sensors(tmp_path: Path) -> None:
    """A diverted partition's records are pending for a rebalance's wait until acknowledged,
    as ``track_message`` leaves them, and Faust's sensors never count them: a sensor counts
    a record out when a stream acknowledges it, so its monitor held them active for ever."""
    from faust.types import TP, ConsumerMessage

    from streams._faust.batch_source import BatchSource

    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    app.sensors.add(app.monitor)  # as the worker's start adds it
    source = BatchSource(app, app.topic("t.tracked"))
    app.topics._acking_topics.add("t.tracked")
    consumer, tp = app.consumer, TP("t.tracked", 0)
    messages = [
        ConsumerMessage(tp.topic, 0, o, 0.0, 0, None, b"k", b"v", None, 1, 1, tp) for o in (7, 8)
    ]
    source._take(consumer, tp, messages)
    assert all(m in consumer._unacked_messages for m in messages)
    source.ack_all(messages)
    assert not consumer._unacked_messages
    assert app.monitor.messages_active == 0
    assert app.monitor.messages_received_total == 0
