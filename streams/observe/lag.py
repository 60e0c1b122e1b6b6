"""The worker's own consumer, seen from outside: lag per partition and readiness.

Lag is what a restart would have to re-process: for every input partition
assigned to this worker, the log end offset minus the offset its consumer group
has committed. Faust commits only the contiguous acknowledged prefix of a
partition (agents here acknowledge by hand, after their output is durable), so
this is the honest number, not the "read" position. A timer refreshes it every
``AC_LAG_INTERVAL_S`` seconds (one ListOffsets request per refresh); partitions
that move to another worker drop out of the gauge.

Register on an app with :func:`register_lag`; ``/healthz`` reports
:func:`worker_status`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import faust
from faust.types import TP

from streams._faust import divert
from streams._faust.consumer import committed_offset
from streams.observe.metrics import CONSUMER_LAG

__all__ = [
    "LagTracker",
    "consumption_starts",
    "register_lag",
    "tables_recovered",
    "worker_status",
]

log = logging.getLogger(__name__)

DEFAULT_INTERVAL_S = 5.0


def input_topics(app: faust.App) -> set[str]:
    """The topics this app's agents and batch sources consume (not table changelogs,
    not Faust internals)."""
    agents = {name for agent in app.agents.values() for name in agent.get_topic_names()}
    return agents | divert.diverted_topics()


def assigned_inputs(app: faust.App) -> list[TP]:
    """This worker's assigned input partitions; empty before the consumer has started."""
    consumer = app.consumer
    try:
        assigned = consumer.assignment()
    except Exception:  # ConsumerNotStarted, or the consumer is being replaced
        return []
    topics = input_topics(app)
    return sorted((tp for tp in assigned if tp.topic in topics), key=lambda tp: tuple(tp))


async def consumption_starts(app: faust.App, tps: list[TP]) -> dict[TP, int]:
    """Where the group's consumption of each partition starts now: the committed offset,
    else (a new group, or a committed 0) the log start, as ``auto_offset_reset``
    "earliest" prescribes."""
    committed = {tp: committed_offset(app, tp) for tp in tps}
    missing = [tp for tp, offset in committed.items() if offset is None]
    earliest = await app.consumer.earliest_offsets(*missing) if missing else {}
    return {
        tp: int(offset if offset is not None else earliest.get(tp) or 0)
        for tp, offset in committed.items()
    }


class LagTracker:
    """Computes lag for the assigned input partitions and publishes the gauge."""

    def __init__(self, app: faust.App) -> None:
        self.app = app
        self._published: set[tuple[str, str, str]] = set()

    @property
    def group(self) -> str:
        return str(self.app.conf.id)

    async def compute(self) -> dict[TP, int]:
        tps = assigned_inputs(self.app)
        if not tps:
            return {}
        ends = await self.app.consumer.highwaters(*tps)
        # With nothing committed, everything retained is lag.
        starts = await consumption_starts(self.app, tps)
        return {tp: max(int(end) - starts[tp], 0) for tp, end in ends.items() if tp in starts}

    def publish(self, lag: dict[TP, int]) -> None:
        current = set()
        for tp, value in lag.items():
            labels = (self.group, tp.topic, str(tp.partition))
            CONSUMER_LAG.labels(*labels).set(value)
            current.add(labels)
        for labels in self._published - current:  # revoked: no longer ours to report
            _remove(CONSUMER_LAG, labels)
        self._published = current

    async def refresh(self) -> None:
        try:
            lag = await self.compute()
        except Exception as exc:  # rebalancing, broker briefly away: try again next tick
            log.debug("consumer lag not refreshed: %s: %s", type(exc).__name__, exc)
            return
        self.publish(lag)


def _remove(gauge: Any, labels: Iterable[str]) -> None:
    try:
        gauge.remove(*labels)
    except KeyError:
        pass


def register_lag(app: faust.App, interval_s: float | None = None) -> LagTracker:
    """Publish ``ac_consumer_lag`` for ``app``'s own consumer group, refreshed by a timer."""
    if interval_s is None:
        settings = getattr(app, "settings", None)
        interval_s = float(getattr(settings, "lag_interval_s", DEFAULT_INTERVAL_S))
    tracker = LagTracker(app)

    @app.timer(interval_s, name="consumer_lag.refresh")
    async def refresh_consumer_lag() -> None:
        await tracker.refresh()

    return tracker


def tables_recovered(app: faust.App) -> bool:
    """Whether the worker's tables are restored and its stream partitions flow."""
    recovery = app.tables.recovery  # type: ignore[attr-defined]  # faust.tables.TableManager
    return bool(recovery.completed.is_set()) and not recovery.in_recovery


def worker_status(app: faust.App) -> dict[str, Any]:
    """What ``/healthz`` reports; ``ready`` is False while starting, rebalancing,
    recovering tables or stopping.

    A worker with no partitions (more workers than partitions) is ready: it is
    a hot spare and still serves its HTTP endpoints (ingest, pull view).
    """
    recovered = tables_recovered(app)
    status = {
        "app": app.conf.id,
        "state": app.state,
        "rebalancing": bool(app.rebalancing),
        "recovered": recovered,
        "generation": app.consumer_generation_id,
        "assigned_partitions": [f"{tp.topic}:{tp.partition}" for tp in assigned_inputs(app)],
    }
    status["ready"] = (
        app.started and not app.should_stop and not status["rebalancing"] and recovered
    )
    return status
