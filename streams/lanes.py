"""Per-key ordered lanes: one worker at a time processes a key's items in order,
different keys run concurrently.

A Faust agent processes a partition strictly in order, so one slow session
(an LLM call, a slow destination) would hold back every other session on the
partition. Lanes keep per-session order while letting sessions overlap. Used
with a no-ack stream: the caller acks an event only after its item is done, and
Faust commits only the contiguous acked prefix of each partition, so a crash
replays whatever was not finished.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from schemas import InvalidMessage
from streams.errors import AgentContextError

__all__ = ["InOrderAcks", "LaneFailed", "Lanes", "feed_lanes"]

T = TypeVar("T")
log = logging.getLogger(__name__)


class LaneFailed(AgentContextError, RuntimeError):
    """A lane's handler raised: its item was not finished, so no later item may run."""


class Lanes(Generic[T]):
    """Run ``handler(key, item)`` in order per key, concurrently across keys.

    ``max_pending`` bounds the items held across all lanes: ``submit`` waits for
    room, which back-pressures the stream instead of buffering without limit.

    The handler owns its failures (retries, dead letters); one that raises anyway
    is a bug. Its item stays unfinished (so never acknowledged), the lanes take
    no more work (``submit`` raises :class:`LaneFailed`: a later item of that
    key must not overtake it), and ``on_error(key, exc)`` is awaited. Workers
    crash there: the process exits non-zero, its supervisor restarts it, and
    the unacknowledged item is redelivered.
    """

    def __init__(
        self,
        handler: Callable[[str, T], Awaitable[None]],
        *,
        max_pending: int = 1000,
        on_error: Callable[[str, BaseException], Awaitable[None]] | None = None,
    ) -> None:
        self._handler = handler
        self._on_error = on_error
        self.failed: LaneFailed | None = None
        self._queues: dict[str, deque[T]] = {}  # a key with items: its lane is active
        # Active keys no worker has taken yet, workers waiting for one, and every worker:
        # a task per lane's activation cost ~4 µs more (tests/unit/test_lanes.py).
        self._ready: deque[str] = deque()
        self._parked: deque[asyncio.Future[None]] = deque()
        self._workers: set[asyncio.Task[None]] = set()
        self._room = asyncio.Semaphore(max_pending)
        self._idle = asyncio.Event()
        self._idle.set()
        # Per busy key: when its current item started (monotonic) and what it is at
        # (``mark``), so that an item that never finishes is visible (``in_progress``).
        self._started: dict[str, float] = {}
        self._stage: dict[str, str] = {}

    @property
    def pending(self) -> int:
        return sum(len(q) for q in self._queues.values())

    @property
    def active_keys(self) -> int:
        return len(self._queues)

    async def submit(self, key: str, item: T) -> None:
        if self.failed is not None:
            raise self.failed
        await self._room.acquire()
        if self.failed is not None:  # failed while this waited for room
            self._room.release()
            raise self.failed
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
            self._idle.clear()
            self._ready.append(key)
            self._wake()
        queue.append(item)

    def _wake(self) -> None:
        """A worker for the key just made ready: one waiting, else a new one (at most one
        per item held, as ``max_pending`` bounds the active keys)."""
        while self._parked:
            waiter = self._parked.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        task = asyncio.create_task(self._work(), name="lanes worker")
        self._workers.add(task)
        task.add_done_callback(self._workers.discard)

    async def _work(self) -> None:
        """A worker: drain the ready lanes one after the other, then wait for another."""
        ready = self._ready
        while True:
            if ready:
                await self._drain(ready.popleft())
                continue
            waiter = asyncio.get_running_loop().create_future()
            self._parked.append(waiter)
            await waiter

    async def _drain(self, key: str) -> None:
        queue = self._queues[key]
        try:
            while queue:
                item = queue[0]
                self._started[key] = time.monotonic()
                self._stage[key] = "started"
                try:
                    await self._handler(key, item)
                finally:
                    queue.popleft()
                    self._room.release()
        except Exception as exc:
            # A bug (see the class): the item and the rest of this lane stay
            # unacknowledged, and replay after the restart on_error brings about.
            log.exception(
                "lane %s: the handler raised; its item and %d after it stay unacknowledged",
                key,
                len(queue),
            )
            self.failed = LaneFailed(f"lane {key!r}: {type(exc).__name__}: {exc}")
            self.failed.__cause__ = exc
            for _ in queue:
                self._room.release()
            queue.clear()
            if self._on_error is not None:
                await self._on_error(key, exc)
        finally:
            del self._queues[key]
            self._started.pop(key, None)
            self._stage.pop(key, None)
            if not self._queues:
                self._idle.set()

    def mark(self, key: str, stage: str) -> None:
        """Note what ``key``'s current item is doing now (shown by ``in_progress``)."""
        if key in self._started:  # not for work done outside the lanes (the sink's inline path)
            self._stage[key] = stage

    def begin_outside(self, key: str, stage: str) -> None:
        """Work on ``key`` done outside the lanes (a sink's inline batch): shown by
        ``in_progress`` like a lane's item, until ``end_outside``."""
        self._started[key] = time.monotonic()
        self._stage[key] = stage

    def end_outside(self, key: str) -> None:
        self._started.pop(key, None)
        self._stage.pop(key, None)

    def in_progress(self) -> list[tuple[str, float, str]]:
        """(key, seconds so far, stage) of each item in progress, longest first."""
        now = time.monotonic()
        found = [(key, now - t, self._stage.get(key, "")) for key, t in self._started.items()]
        return sorted(found, key=lambda entry: -entry[1])

    async def join(self) -> None:
        """Wait until every lane is empty."""
        await self._idle.wait()

    async def close(self) -> None:
        """Cancel the work in progress (a stop that waited long enough); what is left of
        the lanes is dropped, unacknowledged."""
        workers = list(self._workers)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        self._ready.clear()
        self._parked.clear()
        for queue in self._queues.values():
            for _ in queue:
                self._room.release()
        self._queues.clear()
        self._started.clear()
        self._stage.clear()
        self._idle.set()


class _Ticket:
    __slots__ = ("done", "message", "source")

    def __init__(self, source: Any, message: Any) -> None:
        self.source, self.message, self.done = source, message, False


class InOrderAcks:
    """Acknowledge each partition's events in offset order, whatever order lanes finish in.

    Faust's commit can pass an unacknowledged offset (docs/decisions.md); a gap-free
    acked list keeps it behind work in flight (tests/integration/test_reliability.py).

    ``track`` every message in the order its source yields it (offset order per
    partition), then call ``done`` when its work is finished (or skipped); the
    source (a ``BatchSource``) is asked to ``ack`` it when all before it are done.
    """

    def __init__(self) -> None:
        self._pending: defaultdict[Any, deque[_Ticket]] = defaultdict(deque)

    def track(self, source: Any, message: Any) -> _Ticket:
        ticket = _Ticket(source, message)
        self._pending[message.tp].append(ticket)
        return ticket

    async def done(self, ticket: _Ticket) -> None:
        ticket.done = True
        queue = self._pending[ticket.message.tp]
        while queue and queue[0].done:
            head = queue.popleft()
            await head.source.ack(head.message)


async def feed_lanes(
    source: Any,
    lanes: Lanes[tuple[Any, Any]],
    acks: InOrderAcks,
    decode: Callable[[bytes | None], Any],
    on_invalid: Callable[[Any, str], Awaitable[None]],
) -> None:
    """Each record of ``source`` (a ``BatchSource``), decoded, into its session's lane
    with its ``acks`` ticket; one that does not decode goes to ``on_invalid`` (the
    record and why) and is acknowledged at once."""
    async for batch in source.batches():
        for message in batch:
            ticket = acks.track(source, message)
            try:
                decoded = decode(message.value)
            except InvalidMessage as exc:
                await on_invalid(message, exc.reason)
                await acks.done(ticket)
                continue
            await lanes.submit(decoded.session_id, (ticket, decoded))
