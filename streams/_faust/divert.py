"""Fixes to faust-streaming 0.15's seeks and fetches (installed by :func:`apply`), and the
diversion of topics whose records skip Faust's per-message delivery (:func:`divert`).

1. ``Recovery.on_recovery_completed``: seek the paused stream partitions to their
   committed offsets, then resume them (Faust resumed first, so records fetched from
   the pre-seek position reached the agents; the order of faust-streaming PR #217).
2. ``Consumer.getmany``: a seek epoch. A batch whose fetch overlapped a seek does not
   deliver its stream records; the consumer seeks to the committed offsets again and
   fetches them again. Its changelog records are delivered (recovery positions them).
3. ``Consumer.perform_seek``: a partition with no committed offset goes back to the
   beginning, as ``auto_offset_reset="earliest"`` prescribes.
4. ``Consumer._wait_next_records``: records fetched that Faust's getmany will not
   deliver (the flow stopped, or the partition paused, while the fetch waited) are
   un-read: each partition seeks back to its first such record.

Each of the four lost records silently (docs/decisions.md, "Faust's seeks");
tests/integration/test_reliability.py, tests/integration/test_faust_fetch.py and
tests/unit/test_faust_patches.py prove them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast

from faust.tables.recovery import Recovery
from faust.transport.consumer import Consumer, ensure_TP
from faust.types import TP, Message
from faust.types.tuples import ConsumerMessage

from streams._faust import fetch

__all__ = ["apply", "divert", "diverted_topics"]

log = logging.getLogger(__name__)


async def _on_recovery_completed(self: Recovery, generation_id: int = 0) -> None:
    """Faust 0.15.3's ``Recovery.on_recovery_completed``, seeking before resuming."""
    consumer = self.app.consumer
    self.log.info("Restore complete!")
    await self.app.on_rebalance_complete.send()
    self._set_recovery_ended()
    callback_coros = [
        asyncio.ensure_future(
            table.on_recovery_completed(
                self.actives_for_table[table],
                self.standbys_for_table[table],
            )
        )
        for table in self.tables.values()
    ]
    if callback_coros:
        await asyncio.wait(callback_coros)
    assignment = consumer.assignment()
    if self.app.consumer_generation_id != generation_id:
        self.log.warning(
            f"Recovery rebalancing again app id "
            f"{self.app.consumer_generation_id} param {generation_id}"
        )
        return
    if assignment:
        # Seek first, while the stream partitions are still paused ...
        self.log.info("Seek stream partitions to committed offsets.")
        await self._wait(consumer.perform_seek(), timeout=self.app.conf.broker_request_timeout)
    # ... and only then let them fetch.
    consumer.resume_partitions({tp for tp in assignment if not self._is_changelog_tp(tp)})
    self.completed.set()
    self.log.dev("Resume stream partitions")
    self.app.flow_control.resume()
    consumer.resume_flow()
    await cast(Any, self.app)._fetcher.maybe_start()
    self.tables.on_actives_ready()
    if not self.app.assignor.assigned_standbys():
        self.tables.on_standbys_ready()
    self.app.on_rebalance_end()
    self.log.info("Worker ready")


async def _perform_seek(self: Consumer) -> None:
    """Faust's ``perform_seek``, counted before and after (see getmany), and complete.

    Faust (through aiokafka's ``seek_to_committed``) leaves a partition that has
    no committed offset yet (or offset 0) where it is, so records fetched and
    dropped around a rebalance were never fetched again from such a partition
    (found with the stuck-session test: a fresh summarize partition lost the
    request at its head). Those go to the beginning, as ``auto_offset_reset``
    "earliest" (our setting) prescribes for a partition without a commit.
    """
    self._ac_seek_epoch = getattr(self, "_ac_seek_epoch", 0) + 1  # type: ignore[attr-defined]
    try:
        committed = await self.seek_to_committed()
        if self.app.conf.consumer_auto_offset_reset == "earliest":
            for tp, offset in committed.items():
                if not offset and not self._is_changelog_tp(tp):
                    await self.seek(tp, 0)
        # The rest as in Faust's perform_seek.
        self._read_offset.update(
            {
                tp: offset if offset is not None and offset >= 0 else None
                for tp, offset in committed.items()
            }
        )
        self._committed_offset.update(
            {
                ensure_TP(tp): offset if offset else None
                for tp, offset in committed.items()
                if offset is not None
            }
        )
    finally:
        self._ac_seek_epoch += 1  # type: ignore[attr-defined]


# Topics whose records skip Faust's per-message delivery (``streams._faust.batch_source``).
_diverted: dict[str, Callable[[Consumer, TP, list[Message]], None]] = {}


def divert(topic: str, take: Callable[[Consumer, TP, list[Message]], None]) -> None:
    """Hand ``topic``'s records to ``take`` as the consumer fetches them: each partition's
    fetched records in one call, in offset order."""
    _diverted[topic] = take


def diverted_topics() -> set[str]:
    return set(_diverted)


def _delivers(consumer: Consumer, tp: TP, active: set[TP] | None) -> bool:
    """Whether Faust's getmany delivers ``tp``'s fetched records: an active partition,
    or one whose buffer was full (``None``: every partition is active)."""
    return active is None or tp in active or tp in consumer._buffered_partitions


async def _getmany(self: Consumer, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
    """Faust 0.15.3's ``Consumer.getmany``, with the diversion and the seek epoch.

    1. Fetch (``_wait_next_records``), as Faust does.
    2. A diverted topic's records go to their taker, each partition's in one call,
       before anything else runs: no task can seek or revoke between the fetch and the
       take, so Faust's per-record checks (the flow, the generation) hold for the whole
       batch. Faust's per-record path cost a null sink ~3 µs of its ~70 per operation
       (py-spy, docs/performance.md; ``tests/unit/test_faust_patches.py``). The records
       come as Faust's messages already where the compiled reader read them (``fetch``).
    3. The other records (changelogs, plain agents) are yielded one by one, as Faust does.
    4. Stream records fetched before or during a seek are not delivered; the consumer
       seeks to the committed offsets again and they come again. Changelog records are
       always delivered: the re-seek rewinds only stream partitions, so recovery would
       wait for dropped ones for ever (the broker-restart test).
    """
    epoch = getattr(self, "_ac_seek_epoch", 0)
    records, active = await self._wait_next_records(timeout)
    generation_id = self.app.consumer_generation_id
    if records is None or self.should_stop:
        return
    if not self.flow_active:  # as Faust: what was fetched comes again from the commits
        try:
            await self.perform_seek()
        except Exception as exc:
            log.warning("exception performing seek when flow not active %s", exc)
        return
    read_offset = self._read_offset
    to_message = self._to_message
    sought = getattr(self, "_ac_seek_epoch", 0) != epoch
    rest: dict[TP, list[Any]] = {}
    for tp, fetched in records.items():
        take = _diverted.get(tp.topic)
        if take is None:
            rest[tp] = fetched
        elif fetched and not sought and _delivers(self, tp, active):
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            if type(fetched[0]) is ConsumerMessage:  # read as messages (``_faust.fetch``)
                for message in fetched:
                    message.generation_id = generation_id
                take(self, tp, fetched)
            else:
                take(self, tp, [to_message(tp, record) for record in fetched])
            read_offset[tp] = fetched[-1].offset
    for tp, record in self.scheduler.iterate(rest) if rest else ():
        if not self.flow_active or self.app.consumer_generation_id != generation_id:
            break  # Faust's checks: its caller awaits between these records
        if getattr(self, "_ac_seek_epoch", 0) != epoch and not self._is_changelog_tp(tp):
            continue  # it may predate the seek: fetched again after the re-seek below
        if _delivers(self, tp, active):
            self.app.monitor.track_tp_end_offset(tp, self.highwater(tp))
            yield tp, to_message(tp, record)
    if getattr(self, "_ac_seek_epoch", 0) != epoch:
        if self.app.in_recovery:
            # Recovery seeks the stream partitions (paused until then) when it completes
            # (``_on_recovery_completed``). A seek now, mid-recovery, was followed twice
            # by recovery waiting for changelog records that never came ("No event
            # received for active tp"; the broker-restart and worker-joins tests).
            log.info("records fetched across a seek discarded; recovery seeks again")
            return
        # A seek ran while this batch was fetched or delivered. Faust may also have
        # dropped some of its records (for partitions it deems inactive) after the
        # fetch consumed them. Seek again: the stream records come again, in order.
        log.info("records fetched across a seek discarded; seeking to committed offsets again")
        try:
            await _perform_seek(self)
        except Exception:  # e.g. nothing assigned any more: the next rebalance seeks
            log.warning("re-seek after discarding a batch failed", exc_info=True)


_original_wait_next_records = Consumer._wait_next_records


async def _wait_next_records(
    self: Consumer, timeout: float
) -> tuple[Mapping[TP, list[Any]] | None, set[TP] | None]:
    """Faust's ``_wait_next_records``, un-reading what its getmany would drop.

    aiokafka has advanced its position past every record it hands out. Faust drops
    the batch when the flow stopped during the wait, and a partition's records when
    the partition is paused; aiokafka even hands out every partition's records when
    the (live) set of active partitions has emptied during the wait: a rebalance
    pauses them all (tests/integration/test_faust_fetch.py). Stream partitions
    are sought back to their commits later; a changelog partition was not, and its
    recovery waited for ever ("No event received for active tp"; the worker-joins
    test in CI). No other task runs between aiokafka's hand-out and these seeks.
    """
    records, active = await _original_wait_next_records(self, timeout)
    if records:
        flowing, owned = self.flow_active, None
        for tp, fetched in records.items():
            delivered = flowing and _delivers(self, tp, active)
            if fetched and not delivered:
                owned = self.assignment() if owned is None else owned
                if tp in owned:  # a revoked partition is no longer ours to seek
                    await self.seek(tp, fetched[0].offset)  # aiokafka's: never suspends
    return records, active


def apply() -> None:
    """Install the fixes (the package's version guard has checked Faust's version)."""
    Recovery.on_recovery_completed = _on_recovery_completed  # type: ignore[method-assign]
    Consumer.perform_seek = _perform_seek  # type: ignore[method-assign]
    Consumer.getmany = _getmany  # type: ignore[method-assign,assignment]
    Consumer._wait_next_records = _wait_next_records  # type: ignore[method-assign]
    fetch.apply(_diverted.__contains__)
