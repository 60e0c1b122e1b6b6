"""``streams.observe.stalls``: event-loop lag and garbage-collector pauses reach histograms."""

from __future__ import annotations

import asyncio
import gc
import time

from prometheus_client import REGISTRY

from streams.observe.stalls import time_gc_pauses, watch_event_loop
from tests.support.waiting import wait_for


def lag_samples(le: str | None = None) -> float:
    if le is None:
        return REGISTRY.get_sample_value("ac_event_loop_lag_seconds_count") or 0.0
    return REGISTRY.get_sample_value("ac_event_loop_lag_seconds_bucket", {"le": le}) or 0.0


def gc_pauses(generation: int) -> float:
    value = REGISTRY.get_sample_value("ac_gc_pause_seconds_count", {"generation": str(generation)})
    return value or 0.0


def hold_the_loop(seconds: float) -> None:
    """A callback that computes without yielding for ``seconds``."""
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def test_a_callback_that_holds_the_loop_shows_as_lag() -> None:
    watcher = asyncio.create_task(watch_event_loop(interval_s=0.01))
    try:
        started = lag_samples()
        await wait_for(lambda: lag_samples() > started, timeout=5, message="no probe ran")
        late_before = lag_samples() - lag_samples("0.1")
        hold_the_loop(0.15)
        await wait_for(
            lambda: lag_samples() - lag_samples("0.1") > late_before,
            timeout=5,
            message="a 150 ms hold of the loop was not recorded as lag over 100 ms",
        )
    finally:
        watcher.cancel()


def test_each_collection_is_timed_once_by_generation() -> None:
    time_gc_pauses()
    time_gc_pauses()  # idempotent: registering again must not count twice
    before = [gc_pauses(g) for g in range(3)]
    gc.collect(2)
    gc.collect(0)
    after = [gc_pauses(g) for g in range(3)]
    assert after[2] - before[2] == 1
    assert after[0] - before[0] >= 1  # the loop may collect gen 0 on its own meanwhile
