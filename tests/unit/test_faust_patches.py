"""``streams._faust.divert._getmany``: a batch fetched across a seek.

The race itself needs a rebalance during a fetch (the reliability tests meet it
now and then on a real broker); here the seek is made to happen mid-batch, on a
stand-in for Faust's consumer that has just what the patched method reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from faust.types import TP

from streams._faust import divert

STREAM = TP("t.context", 0)
CHANGELOG = TP("app-contexts-changelog", 0)
# The fetch a test scripts: what Faust's own getmany would yield, seeks included.
Fetch = Callable[[Any, float], AsyncIterator[tuple[TP, "Record"]]]


@dataclass
class Record:
    offset: int


@dataclass
class StandInConsumer:
    _read_offset: dict[TP, int | None] = field(default_factory=dict)
    _ac_seek_epoch: int = 0
    reseeks: int = 0
    app: Any = field(default_factory=lambda: SimpleNamespace(in_recovery=False))

    def _is_changelog_tp(self, tp: TP) -> bool:
        return tp.topic.endswith("-changelog")


async def deliver(
    monkeypatch: pytest.MonkeyPatch, consumer: StandInConsumer, fetched: Fetch
) -> list[tuple[TP, int]]:
    """What the patched ``getmany`` delivers of ``fetched``; re-seeks are counted."""

    async def reseek(self: Any) -> None:
        self.reseeks += 1

    monkeypatch.setattr(divert, "_original_getmany", fetched)
    monkeypatch.setattr(divert, "_perform_seek", reseek)
    return [(tp, r.offset) async for tp, r in divert._getmany(consumer, 1.0)]  # type: ignore[arg-type]


async def test_stream_records_fetched_across_a_seek_are_refetched_changelog_records_delivered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = StandInConsumer()

    async def fetched(self: Any, timeout: float) -> AsyncIterator[tuple[TP, Record]]:
        yield STREAM, Record(10)
        self._ac_seek_epoch += 2  # a rebalance's seek ran while the batch was handed out
        yield CHANGELOG, Record(0)
        yield STREAM, Record(11)
        yield CHANGELOG, Record(1)

    delivered = await deliver(monkeypatch, consumer, fetched)

    # Recovery positions changelog partitions itself: dropping these lost them for good.
    assert delivered == [(STREAM, 10), (CHANGELOG, 0), (CHANGELOG, 1)]
    assert consumer.reseeks == 1  # the stream record dropped (offset 11) is fetched again


async def test_a_batch_without_a_seek_is_delivered_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    consumer = StandInConsumer()

    async def fetched(self: Any, timeout: float) -> AsyncIterator[tuple[TP, Record]]:
        for offset in range(3):
            yield STREAM, Record(offset)

    delivered = await deliver(monkeypatch, consumer, fetched)

    assert delivered == [(STREAM, 0), (STREAM, 1), (STREAM, 2)]
    assert consumer.reseeks == 0


async def test_during_recovery_the_stream_is_left_to_recovery_s_own_seek(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    consumer = StandInConsumer(app=SimpleNamespace(in_recovery=True))

    async def fetched(self: Any, timeout: float) -> AsyncIterator[tuple[TP, Record]]:
        self._ac_seek_epoch += 2
        yield STREAM, Record(5)
        yield CHANGELOG, Record(7)

    delivered = await deliver(monkeypatch, consumer, fetched)

    assert delivered == [(CHANGELOG, 7)]
    assert consumer.reseeks == 0  # recovery's completion seeks the stream partitions
