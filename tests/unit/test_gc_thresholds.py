"""A worker's garbage-collector settings (``streams.app._calm_the_garbage_collector``).

A young collection walks every young object still alive. A worker's in-flight work
(fetched records, units waiting for acks, summarize requests) rises and falls by
hundreds of thousands of tracked objects on a backlog; with the young threshold under
that swing a collection ran every second, 30-150 ms each, and freed nothing
(docs/performance.md, session 20).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

from streams.app import GC_YOUNG_THRESHOLD, _calm_the_garbage_collector


@contextmanager
def worker_gc() -> Iterator[list[int]]:
    """The worker's settings in this process; yields the generations collected meanwhile."""
    collected: list[int] = []

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collected.append(info["generation"])

    thresholds = gc.get_threshold()
    _calm_the_garbage_collector()
    gc.collect(0)  # the young count starts from zero, as after any collection
    gc.callbacks.append(record)
    try:
        yield collected
    finally:
        gc.callbacks.remove(record)
        gc.unfreeze()
        gc.set_threshold(*thresholds)


def test_in_flight_work_rising_and_falling_triggers_no_collection() -> None:
    swing = 250_000  # over the bench backlog's swing: at a threshold of 200,000 passes still came
    with worker_gc() as collected:
        for _ in range(8):
            in_flight = [[i] for i in range(swing)]  # one tracked object each
            del in_flight
    assert collected == [], f"{len(collected)} collections of work that was all still alive"


def test_cyclic_garbage_is_still_collected() -> None:
    with worker_gc() as collected:
        for _ in range(GC_YOUNG_THRESHOLD + 1000):
            cycle: list[object] = []
            cycle.append(cycle)  # freed only by the cyclic collector
        del cycle
    assert collected, "growing garbage never started a collection"
