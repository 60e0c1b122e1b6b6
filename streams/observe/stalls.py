"""What holds up a worker's event loop: its lag, and the garbage collector's pauses.

Latency at a steady rate is decided by rare stalls more than by the average
cost: a 100 ms stall every few seconds puts 1-2% of all actions past 100 ms.
Two histograms show them in production (and in ``scripts/bench/``):

* ``ac_event_loop_lag_seconds``: a task due every 50 ms records how late it ran;
* ``ac_gc_pause_seconds{generation}``: each cyclic collection, timed by
  ``gc.callbacks``.
"""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

from streams.observe.metrics import EVENT_LOOP_LAG, GC_PAUSE

__all__ = ["time_gc_pauses", "watch_event_loop"]

PROBE_INTERVAL_S = 0.05


async def watch_event_loop(interval_s: float = PROBE_INTERVAL_S) -> None:
    """Record, for ever, how late the loop wakes a task due every ``interval_s``."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        EVENT_LOOP_LAG.observe(max(loop.time() - due, 0.0))


def time_gc_pauses() -> None:
    """Observe every collection's duration in ``ac_gc_pause_seconds`` (idempotent)."""
    if _on_gc in gc.callbacks:
        return
    gc.callbacks.append(_on_gc)


_started: float = 0.0
_by_generation = [GC_PAUSE.labels(str(g)) for g in range(3)]


def _on_gc(phase: str, info: dict[str, Any]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        _by_generation[info["generation"]].observe(time.perf_counter() - _started)
