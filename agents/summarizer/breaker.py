"""The LLM circuit breaker: closed, open, half-open with a single probe.

Closed, it counts consecutive failures; at ``threshold`` it opens and refuses every
attempt for ``reset_s``. Then it is half-open: the first attempt is the probe and the
others are refused until the probe's outcome closes it or opens it again. Callers wait
on :attr:`CircuitBreaker.changed`, which is set on every transition.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Final, Literal, NoReturn

from agents.summarizer.llm import LLMError
from streams.observe.metrics import BREAKER_STATE, BREAKER_TRANSITIONS, LLM_FAILURES

__all__ = ["BreakerOpen", "CircuitBreaker"]

log = logging.getLogger(__name__)

State = Literal["closed", "open", "half_open"]
_MIN_WAIT_S: Final = 0.01


class BreakerOpen(LLMError):
    """An attempt refused because the breaker is open (or its probe is running)."""

    def __init__(self, wait_s: float, changed: asyncio.Event) -> None:
        super().__init__(
            f"LLM circuit breaker is open; next probe in {wait_s:.2f}s",
            retryable=True,
            kind="breaker_open",
        )
        self.wait_s = wait_s
        self.changed = changed


class CircuitBreaker:
    """One per :class:`~agents.summarizer.resilience.ResilientLLM`, shared by its callers.

    ``admit()`` before an attempt, ``record()`` after it; no await runs between a
    decision and the state it changes, so no lock is needed on one event loop.
    """

    def __init__(
        self,
        threshold: int,
        reset_s: float,
        *,
        probe_wait_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.threshold = threshold
        self.reset_s = reset_s
        self.probe_wait_s = probe_wait_s  # a refused caller's wait while a probe runs
        self.state: State = "closed"
        self.opened_count = 0
        self.closed_count = 0
        self.changed = asyncio.Event()  # set, then replaced, on each transition
        self._failures = 0  # consecutive, while closed
        self._opened_at = 0.0
        self._probing = False
        self._clock = clock

    def admit(self) -> bool:
        """Let an attempt run, or raise :class:`BreakerOpen`; True when it is the probe."""
        if self.state == "closed":
            return False
        if self.state == "open":
            wait_s = self._opened_at + self.reset_s - self._clock()
            if wait_s > 0:
                self._refuse(wait_s)
            self._set("half_open")
        if self._probing:  # the probe's outcome wakes the caller, else this wait ends
            self._refuse(self.probe_wait_s)
        self._probing = True
        return True

    def record(self, *, failed: bool | None, probe: bool) -> None:
        """An admitted attempt's outcome; ``failed=None`` when it says nothing about the
        endpoint (cancelled, or a timeout cut short by the caller's budget)."""
        if probe:
            self._probing = False
        if failed is None or self.state == "open":  # open: a straggler admitted before
            return
        if not failed:
            self._failures = 0
            if self.state == "half_open":
                self._set("closed")
            return
        self._failures += 1
        if self.state == "half_open" or self._failures >= self.threshold:
            self._set("open")

    def _refuse(self, wait_s: float) -> NoReturn:
        LLM_FAILURES.labels("breaker_open").inc()
        raise BreakerOpen(max(wait_s, _MIN_WAIT_S), self.changed)

    def _set(self, state: State) -> None:
        previous, self.state = self.state, state
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()  # wake the callers waiting for the breaker
        if state == "open":
            self._opened_at = self._clock()
            self._failures = 0
            if previous == "half_open":
                log.info("LLM circuit breaker probe failed; staying open %.1fs", self.reset_s)
                return
            self.opened_count += 1
            BREAKER_STATE.set(1)
            BREAKER_TRANSITIONS.labels(to="open").inc()
            log.warning(
                "LLM circuit breaker opened after %d consecutive failures; next probe in %.1fs",
                self.threshold,
                self.reset_s,
            )
        elif state == "closed":
            self.closed_count += 1
            BREAKER_STATE.set(0)
            BREAKER_TRANSITIONS.labels(to="closed").inc()
            log.warning("LLM circuit breaker closed; the LLM answered again")

    @property
    def is_open(self) -> bool:
        """True from opening until a probe succeeds (half-open included)."""
        return self.state != "closed"
