"""A topic's records in batches, past Faust's per-message delivery.

Faust hands every record to an agent one at a time: a ``wait_first`` race per
record (four tasks and an ``asyncio.wait``), the conductor's callback, an
Event, a queue, the stream's iteration. Measured here, an agent that does
nothing gets 7,000-9,000 records/s that way, while the same consumer yields
90,000-107,000 records/s when its records are taken as it fetches them
(``scripts/bench.py``: the a' and a'' floors). A ``BatchSource`` takes its topic's
records there (``streams.faust_patches.divert``) and hands them out in
batches of whatever has arrived.

Everything else stays Faust's: group membership and assignment, table
recovery (records flow only after it), commits (of acknowledged offsets only:
the consumer of a batch acknowledges each record with :meth:`ack` when its
effects are durable), rebalances. On revocation Faust clears the buffer with
its agents' queues (``flow_control.clear()``), and waits for the records
taken and not yet acknowledged (they are tracked like a stream's).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator

import faust
from faust.transport.consumer import Consumer
from faust.types import TP, Message

from streams import faust_patches, metrics

__all__ = ["BatchSource"]


class BatchSource:
    """Subscribes the app to ``topic`` and yields its records in fetch order.

    ``max_buffered`` records waiting: fetching pauses for a partition that
    adds to a full buffer, and resumes when half of it is taken.
    """

    def __init__(self, app: faust.App, topic: faust.TopicT, *, max_buffered: int = 4096) -> None:
        self.app, self.topic, self.max_buffered = app, topic, max_buffered
        self._buffer: deque[Message] = deque()
        self._ready = asyncio.Event()
        self._paused: set[TP] = set()
        app.topics.add(topic)  # Faust subscribes to it (and assigns it) as for an agent
        app.flow_control.manage_queue(self)  # type: ignore[arg-type]  # cleared on revocation
        faust_patches.divert(topic.get_topic_name(), self._take)

    def _take(self, consumer: Consumer, _: TP, message: Message) -> None:
        tp = TP(message.topic, message.partition)  # Faust's (the fetch's is aiokafka's)
        consumer.track_message(message)  # a rebalance waits until it is acknowledged
        self._buffer.append(message)
        self._ready.set()
        if len(self._buffer) >= self.max_buffered and tp not in self._paused:
            self._paused.add(tp)
            consumer.on_buffer_full(tp)
            metrics.FETCH_PAUSES.labels(tp.topic).inc()

    def clear(self) -> None:
        """Drop what is buffered: revoked, it is fetched again by its next owner."""
        self._buffer.clear()
        self._resume()

    def _resume(self) -> None:
        for tp in self._paused:
            self.app.consumer.on_buffer_drop(tp)
        self._paused.clear()

    async def batches(self, max_size: int = 500) -> AsyncIterator[list[Message]]:
        """Whatever has arrived, up to ``max_size`` records, as soon as there is any."""
        buffer = self._buffer
        while True:
            while not buffer:
                self._ready.clear()
                await self._ready.wait()
            batch = [buffer.popleft() for _ in range(min(len(buffer), max_size))]
            if self._paused and len(buffer) <= self.max_buffered // 2:
                self._resume()
            yield batch

    async def ack(self, message: Message) -> None:
        """The record's effects are durable: Faust may commit past it."""
        self.app.consumer.ack(message)
