"""Attempts' deadlines watched by one timer: ``asyncio.timeout`` for many calls at once.

An ``asyncio.timeout`` per LLM attempt schedules and cancels a timer handle of its own,
7 µs a call, ~2% of the pipeline worker around an instant LLM (docs/performance.md);
here an attempt is a dict entry, and one timer handle, at the earliest deadline, serves
them all. A task past its deadline is cancelled and its call raises ``TimeoutError``,
as under ``asyncio.timeout``, unless something else cancelled it too: then the
``CancelledError`` goes on (tests/unit/test_llm.py::test_deadlines_*).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["Deadlines"]

T = TypeVar("T")


class Deadlines:
    """``await deadlines.run(seconds, awaitable)`` in the tasks of one event loop."""

    def __init__(self) -> None:
        self._due: dict[asyncio.Task[object], float] = {}  # a task in a call: its deadline
        self._expired: set[asyncio.Task[object]] = set()  # cancelled here, not yet told
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # the timer's

    async def run(self, seconds: float, awaitable: Awaitable[T]) -> T:
        """``await awaitable``, or ``TimeoutError`` once ``seconds`` have passed."""
        task = asyncio.current_task()
        assert task is not None, "Deadlines.run runs in a task"
        loop = task.get_loop()
        deadline = loop.time() + seconds
        if task in self._due:
            raise RuntimeError("Deadlines.run: one call at a time per task")
        cancelling = task.cancelling()
        self._due[task] = deadline
        timer = self._timer
        if timer is None or self._loop is not loop or deadline < timer.when():
            if timer is not None:
                timer.cancel()
            self._timer, self._loop = loop.call_at(deadline, self._expire), loop
        try:
            return await awaitable
        except asyncio.CancelledError:
            if task in self._expired and task.uncancel() <= cancelling:
                raise TimeoutError from None
            raise
        finally:
            del self._due[task]
            self._expired.discard(task)

    def _expire(self) -> None:
        """The timer: cancel each task past its deadline, then wait for the next one."""
        self._timer = None
        if not self._due:
            return
        loop = asyncio.get_running_loop()
        now, earliest = loop.time(), None
        for task, deadline in self._due.items():
            if deadline <= now:
                if task not in self._expired:
                    self._expired.add(task)
                    task.cancel()
            elif earliest is None or deadline < earliest:
                earliest = deadline
        if earliest is not None:
            self._timer = loop.call_at(earliest, self._expire)
