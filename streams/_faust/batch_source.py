"""A topic's records in batches, past Faust's per-message delivery.

Faust hands every record to an agent one at a time: a ``wait_first`` race per
record (four tasks and an ``asyncio.wait``), the conductor's callback, an
Event, a queue, the stream's iteration. Measured here, an agent that does
nothing gets 7,000-9,000 records/s that way, while the same consumer yields
90,000-107,000 records/s when its records are taken as it fetches them
(``scripts/bench/``: the a' and a'' floors). A ``BatchSource`` takes its topic's
records there (``divert.divert``, a fetched partition at a time) and hands them out in
batches of whatever has arrived.

Everything else stays Faust's: group membership and assignment, table
recovery (records flow only after it), commits (of acknowledged offsets only:
the consumer of a batch acknowledges each record with :meth:`ack` when its
effects are durable), rebalances. On revocation Faust clears the buffer with
its agents' queues (``flow_control.clear()``), and waits for the records
taken and not yet acknowledged (they are tracked like a stream's).

Timers that judge sessions by their state (idle expiry) ask
:meth:`BatchSource.caught_up` which partitions' state is current.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import AsyncIterator, Iterable

import faust
from faust.transport.consumer import Consumer
from faust.types import TP, Message

from streams._faust import divert
from streams._faust.consumer import ack_all, track_all
from streams.observe import metrics
from streams.observe.lag import consumption_starts, tables_recovered

__all__ = ["BatchSource"]

log = logging.getLogger(__name__)


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
        self._processed_to: dict[int, int] = {}  # partition -> offset after the last batch done
        self._ends_before: dict[int, int] = {}  # partition -> its log end at caught_up's last call
        app.topics.add(topic)  # Faust subscribes to it (and assigns it) as for an agent
        app.flow_control.manage_queue(self)  # type: ignore[arg-type]  # cleared on revocation
        divert.divert(topic.get_topic_name(), self._take)
        self._acknowledged = metrics.RECORDS_ACKNOWLEDGED.labels(topic.get_topic_name())

    def _take(self, consumer: Consumer, fetched: TP, messages: list[Message]) -> None:
        """One partition's fetched records (``divert``), tracked and buffered in order."""
        track_all(consumer, messages)  # a rebalance waits until each is acknowledged
        self._buffer.extend(messages)
        self._ready.set()
        tp = TP(fetched.topic, fetched.partition)  # Faust's (the fetch's is aiokafka's)
        if len(self._buffer) >= self.max_buffered and tp not in self._paused:
            self._paused.add(tp)
            consumer.on_buffer_full(tp)
            metrics.FETCH_PAUSES.labels(tp.topic).inc()

    def clear(self) -> None:
        """Drop what is buffered: revoked, it is fetched again by its next owner."""
        self._buffer.clear()
        self._processed_to.clear()  # what they say of a partition is stale once it moves
        self._ends_before.clear()
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
            self._note_processed(batch)  # the caller asks for more: it is done with these

    def _note_processed(self, batch: list[Message]) -> None:
        processed_to = self._processed_to
        for message in batch:
            processed_to[message.partition] = message.offset + 1

    async def caught_up(self) -> set[int]:
        """The assigned partitions read up to where their log ended at the previous call.

        A session's state is current only there. Elsewhere its next records may
        still wait in the log: on a worker restarted onto a backlog, or one whose
        partitions stayed paused through a long recovery (tests/integration/test_fidelity.py).
        The previous call's log end, not this one's: under steady traffic a
        partition is never read to its end of the moment (records are always in
        flight), but it is read, milliseconds later, to where it ended a scan ago.
        Empty at the first call after (re)starting, while the tables recover, and
        when the log ends cannot be read now.
        """
        if not tables_recovered(self.app):
            self._ends_before.clear()  # what a recovery paused is behind them
            return set()
        name = self.topic.get_topic_name()
        consumer = self.app.consumer
        try:
            tps = [tp for tp in consumer.assignment() if tp.topic == name]
            ends = await consumer.highwaters(*tps) if tps else {}
            unread = [tp for tp in tps if tp.partition not in self._processed_to]
            starts = await consumption_starts(self.app, unread) if unread else {}
        except Exception as exc:  # rebalancing, broker briefly away: the next scan asks again
            log.debug("log ends of %s not read: %s: %s", name, type(exc).__name__, exc)
            return set()
        before, self._ends_before = (
            self._ends_before,
            {tp.partition: end for tp, end in ends.items()},
        )
        return {
            tp.partition
            for tp in ends
            if tp.partition in before
            and before[tp.partition] <= self._processed_to.get(tp.partition, starts.get(tp, -1))
        }

    async def ack(self, message: Message) -> None:
        """The record's effects are durable: Faust may commit past it."""
        self.ack_all((message,))

    def ack_all(self, messages: Iterable[Message]) -> None:
        """:meth:`ack` each of ``messages``, in order (one call per unit, not a coroutine each)."""
        if acknowledged := ack_all(self.app.consumer, messages):
            self._acknowledged.inc(acknowledged)
