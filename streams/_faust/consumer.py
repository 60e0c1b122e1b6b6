"""Faust's aiokafka consumer on the worker's own event loop, not in a thread of its own.

Faust runs aiokafka in a ``ServiceThread`` with a second event loop, and every
fetch, commit and seek crosses to that thread and back (a method queue, a
future per call, a wake-up of the other loop), with the GIL passing between the
two threads at each crossing: ~11,000 ``futex`` calls a second at 1,000 actions/s.
On one loop the same calls are plain awaits. Measured at 5,000 actions/s (9 and 8
runs alternated): p50 <= 20-30 ms against 30-40 ms, p99 <= 40-100 ms against
50-125 ms, the same CPU (docs/performance.md, session 7). The calls skip Faust's
method queue too (``call_thread``), which only exists to cross to the thread.

The trade-off is the reason Faust has the thread: heartbeats now share the
loop, so code that blocked the loop longer than the session timeout would get
the worker dropped from its group. Nothing in these workers blocks the loop;
``AC_CONSUMER_THREAD=true`` restores Faust's thread.

On the loop or in the thread, :func:`wait_while_busy` makes a fetch that follows records
wait at the broker (``AC_FETCH_MIN_BYTES``, ``AC_FETCH_MAX_WAIT_MS``), through two of
aiokafka's fetcher attributes and its ``_proc_fetch_request``.

:func:`track_all` and :func:`ack_all` are the consumer's tracking and acknowledgement of a
fetched partition's records, and of a unit's, at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, cast

import faust
from faust.transport.drivers.aiokafka import AIOKafkaConsumerThread, Consumer
from faust.types import TP, Message
from faust.types.tuples import ack_lock
from mode.utils.futures import maybe_async, notify
from mode.utils.times import Seconds, want_seconds

__all__ = [
    "MainLoopConsumer",
    "ThreadConsumer",
    "ack_all",
    "committed_offset",
    "track_all",
    "wait_while_busy",
]


class _ConsumerThread(AIOKafkaConsumerThread):
    """Faust's consumer "thread", its fetches waiting at the broker while records come."""

    async def on_start(self) -> None:
        await super().on_start()  # the consumer made and started, with Faust's fetch wait
        wait = cast(Any, self.app).fetch_wait()  # streams._faust.app_base.FaustApp
        if wait is not None:
            wait_while_busy(cast(Any, self)._consumer._fetcher, wait)


def wait_while_busy(fetcher: Any, busy: tuple[int, int]) -> None:
    """After a fetch that brought records, the next waits at the broker for ``busy`` (bytes,
    ms); after one that brought none, as the consumer was made to (Faust: 1 byte, up to
    1,500 ms). Faust's alone made each arrival a round of the worker's, 2.5x its CPU at
    5,000 actions/s; ``busy`` alone polled an idle worker every 10 ms (docs/decisions.md)."""
    idle = fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms
    fetch = fetcher._proc_fetch_request  # aiokafka's, bound: true if records were added

    async def fetched(assignment: Any, node_id: int, request: Any) -> bool:
        got = await fetch(assignment, node_id, request)
        fetcher._fetch_min_bytes, fetcher._fetch_max_wait_ms = busy if got else idle
        return bool(got)

    fetcher._proc_fetch_request = fetched  # the fetch routine's next requests are built so


class ThreadConsumer(Consumer):
    """The aiokafka ``Consumer`` of Faust in its own thread, with the app's fetch wait."""

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _ConsumerThread(self, loop=self.loop, beacon=self.beacon)


class _MainLoopConsumerThread(_ConsumerThread):
    """Faust's consumer "thread", served as a task of the worker's loop."""

    _serving: asyncio.Task[None] | None = None  # held: the loop keeps only weak references

    async def start(self) -> None:
        # ServiceThread.start without the thread: ``_serve`` starts the service and
        # resolves ``_thread_running``, then runs until the service is stopped.
        self._thread_started.set()
        self._thread_running = asyncio.Future(loop=self.parent_loop)
        self.add_future(self._keepalive2())
        self._serving = asyncio.ensure_future(self._serve())
        try:
            await self._thread_running
        finally:
            self._thread_running = None

    async def call_thread(
        self, fun: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any
    ) -> Any:
        # Faust's queue crosses to the thread's loop: on one loop it cost each fetch a
        # self-pipe wake-up both ways and three tasks (test_consumer_calls_are_plain_awaits).
        return await maybe_async(fun(*args, **kwargs))

    async def _gather_remaining_tasks(self) -> None:
        # Faust sweeps every task left on its thread's loop; this loop is the
        # worker's, and its other tasks are not this service's to cancel.
        return


class MainLoopConsumer(Consumer):
    """The aiokafka ``Consumer`` of Faust, with its consumer on the calling loop."""

    async def sleep(self, n: Seconds) -> None:
        # Faust's fetch loop yields with sleep(0) before each fetch; mode's sleep waits for
        # an Event with wait_for: a task made and cancelled each round (test_consumer_loop.py).
        if want_seconds(n) > 0:
            await super().sleep(n)
        else:
            await asyncio.sleep(0)

    def _new_consumer_thread(self) -> AIOKafkaConsumerThread:
        return _MainLoopConsumerThread(
            self, loop=self.loop, thread_loop=self.loop, beacon=self.beacon
        )


def committed_offset(app: faust.App, tp: TP) -> int | None:
    """The group's committed offset for ``tp`` as this worker's consumer knows it.

    Faust keeps it in ``Consumer._committed_offset``: loaded from the broker when
    the partition is assigned, updated by each commit, dropped on revocation.
    It stores a committed 0 as ``None``, like "nothing committed yet".
    """
    offsets: Any = getattr(app.consumer, "_committed_offset", {})
    value = offsets.get(tp)  # .get: the mapping is a defaultdict, don't grow it
    return int(value) if value is not None else None


def track_all(consumer: Any, messages: Iterable[Message]) -> None:
    """Faust 0.15.3's ``Consumer.track_message`` for each of ``messages``, without its sensors:
    a rebalance waits for them to be acknowledged (``ack_all``).

    The sensors count a record in there and out when a stream acknowledges it, which a
    diverted record never reaches: Faust's monitor held each as active for ever, at ~1 µs
    a record (3.5% of a null sink by py-spy; test_consumer_loop.py, "tracked").
    """
    consumer._unacked_messages.update(messages)


def ack_all(consumer: Any, messages: Iterable[Message]) -> int:
    """Faust 0.15.3's ``Consumer.ack`` for each of ``messages``, under one lock and one
    wake-up of its waiters: the number acknowledged now (not before).

    Per record, Faust's took its lock, looked up the topic and woke its waiters: 5% of
    a null sink's CPU by py-spy (test_consumer_loop.py holds it to Faust's own ``ack``).
    """
    acking = consumer.app.topics.acks_enabled_for
    committed, indexes, acked = consumer._committed_offset, consumer._acked_index, consumer._acked
    unacked = consumer._unacked_messages
    count = 0
    with ack_lock:
        for message in messages:
            if message.acked:
                continue
            message.acked = True
            if not acking(message.topic):
                continue
            tp, offset = message.tp, message.offset
            start = committed[tp]
            if start is None or offset >= start:
                index = indexes[tp]
                if offset not in index:
                    unacked.discard(message)
                    index.add(offset)
                    acked[tp].append(offset)
                    count += 1
        consumer._n_acked += count
        notify(consumer._waiting_for_ack)
    return count
