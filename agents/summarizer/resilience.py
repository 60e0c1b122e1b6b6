"""Retries, a circuit breaker, a concurrency limit and timeouts around any LLMCallable.

Why each piece:
- the semaphore bounds load on the provider; it is held only while an attempt
  runs, so callers backing off do not starve callers ready to go;
- the breaker (:mod:`agents.summarizer.breaker`) stops a fleet of sessions from
  hammering a provider that is down: while it is open, callers wait for the
  half-open time and a single probe decides whether it closes again;
- retries use full-jitter exponential backoff (tenacity), but never shorter than
  the server's Retry-After, and stop once ``retry_budget_s`` is spent, so a
  summary is either produced or failed within a known time;
- the per-attempt timeout protects against user callables that hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Final

from tenacity import AsyncRetrying, RetryCallState, RetryError, retry_if_exception
from tenacity.wait import wait_random_exponential

from agents.summarizer.breaker import BreakerOpen, CircuitBreaker
from agents.summarizer.deadlines import Deadlines
from agents.summarizer.llm import LLMCallable, LLMError, llm_session
from streams.observe.metrics import LLM_FAILURES, LLM_IN_FLIGHT, LLM_LATENCY
from streams.settings import Settings

__all__ = ["LLMUnavailable", "ResilientLLM"]

log = logging.getLogger(__name__)

# Extra time a ResilientLLM built from settings gives an attempt beyond the HTTP
# client's own timeout, so the client's clearer timeout error normally wins.
_ATTEMPT_TIMEOUT_GRACE_S: Final = 5.0
FAILURE_LOG_EVERY_S: Final = 10.0


class FailureLog:
    """A WARNING for each failed LLM call, naming the session, the attempt and the reason;
    but at most one line per ``every_s`` for each kind of failure, which says how many
    it stands for: an outage's retry storm stays a line every few seconds, not thousands
    (tests/unit/test_llm.py::test_each_llm_failure_is_logged_once_and_storms_are_summarised).
    """

    def __init__(self, every_s: float = FAILURE_LOG_EVERY_S) -> None:
        self.every_s = every_s
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def failed(self, attempt: int, failure: LLMError) -> None:
        now, kind = time.monotonic(), failure.kind
        if now - self._last.get(kind, -self.every_s) < self.every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return
        self._last[kind] = now
        held = self._held.pop(kind, 0)
        log.warning(
            "LLM call for session %s failed (attempt %d, %s): %s%s",
            llm_session.get(),
            attempt,
            kind,
            failure,
            f" [{held} more {kind} failures in the {self.every_s:g}s before this one]"
            if held
            else "",
        )


class LLMUnavailable(LLMError):
    """The retry budget ran out (or the breaker will not half-open within it).

    ``last_cause`` is the last attempt's error; ``retryable`` mirrors it, so a
    caller may choose to try the whole summary again later.
    """

    def __init__(self, message: str, *, last_cause: BaseException | None, attempts: int) -> None:
        retryable = last_cause.retryable if isinstance(last_cause, LLMError) else True
        super().__init__(message, retryable=retryable, kind="unavailable")
        self.last_cause = last_cause
        self.attempts = attempts


@dataclass
class _Call:
    """Per-call retry state shared by the attempt, wait and sleep hooks."""

    deadline: float | None = None  # monotonic; set when the first attempt starts
    wake_on_change: asyncio.Event | None = None  # set for breaker waits only
    attempts: int = 0
    last_error: LLMError | None = None  # the last real failure, for LLMUnavailable
    started: float = field(default_factory=time.monotonic)


def _should_retry(exc: BaseException) -> bool:
    return isinstance(exc, LLMError) and exc.retryable and not isinstance(exc, LLMUnavailable)


def _check_answer(answer: object) -> None:
    """A blank or missing answer is a retryable failure, like a provider's empty one."""
    if answer is None or (isinstance(answer, str) and not answer.strip()):
        raise LLMError("the LLM returned an empty answer", retryable=True, kind="empty")
    if not isinstance(answer, str):
        raise TypeError(f"LLM callable returned {type(answer).__name__}, not str")


class ResilientLLM:
    """An LLMCallable that retries, limits concurrency and trips a breaker.

    ``await resilient(prompt)`` returns the answer or raises ``LLMError``:
    the original non-retryable error at once (e.g. HTTP 401/400), or
    ``LLMUnavailable`` when the retry budget is spent. Nothing else escapes
    except ``asyncio.CancelledError``. Use one instance per event loop, shared by
    every caller in it: the limit and the breaker are only meaningful if shared.
    """

    def __init__(
        self,
        llm: LLMCallable,
        *,
        concurrency: int,
        failure_threshold: int,
        reset_timeout_s: float,
        retry_budget_s: float,
        max_wait_s: float,
        attempt_timeout_s: float,
        base_wait_s: float = 0.5,
    ) -> None:
        if concurrency < 1 or failure_threshold < 1:
            raise ValueError("concurrency and failure_threshold must be >= 1")
        if min(reset_timeout_s, retry_budget_s, max_wait_s, attempt_timeout_s, base_wait_s) <= 0:
            raise ValueError("timeouts, waits and budgets must be > 0")
        self._llm = llm
        self.failures = FailureLog()
        self.concurrency = concurrency
        self._semaphore = asyncio.Semaphore(concurrency)
        self.retry_budget_s = retry_budget_s
        self.max_wait_s = max_wait_s
        self.attempt_timeout_s = attempt_timeout_s
        self._backoff = wait_random_exponential(multiplier=base_wait_s, max=max_wait_s)
        self.breaker = CircuitBreaker(
            failure_threshold, reset_timeout_s, probe_wait_s=attempt_timeout_s
        )
        self._deadlines = Deadlines()  # the attempts' timeouts, one timer for all

    @classmethod
    def from_settings(cls, llm: LLMCallable, settings: Settings) -> ResilientLLM:
        return cls(
            llm,
            concurrency=settings.llm_concurrency,
            failure_threshold=settings.breaker_failures,
            reset_timeout_s=settings.breaker_reset_s,
            retry_budget_s=settings.llm_retry_budget_s,
            max_wait_s=settings.llm_retry_max_wait_s,
            attempt_timeout_s=settings.llm_timeout_s + _ATTEMPT_TIMEOUT_GRACE_S,
        )

    async def aclose(self) -> None:
        """Close the wrapped callable when it holds a client (``OpenAIChat`` does)."""
        close = getattr(self._llm, "aclose", None)
        if close is not None:
            await close()

    async def __call__(self, prompt: str) -> str:
        call = _Call()
        try:
            # The first attempt runs outside tenacity, whose set-up costs more CPU than
            # the rest of a call together (docs/performance.md); a failure enters it.
            return await self._attempt(prompt, call)
        except LLMError as exc:
            if not _should_retry(exc):
                raise
            return await self._retry(prompt, call, first_failure=exc)

    async def _retry(self, prompt: str, call: _Call, first_failure: LLMError) -> str:
        """Tenacity's loop, entered with the first attempt's failure as attempt 1, so
        the backoff, ``Retry-After`` and budget apply exactly as if it had run it."""
        replayed = False

        async def attempt() -> str:
            nonlocal replayed
            if not replayed:
                replayed = True
                raise first_failure
            return await self._attempt(prompt, call)

        retrying = AsyncRetrying(
            retry=retry_if_exception(_should_retry),
            wait=lambda state: self._wait(state, call),
            stop=lambda state: self._out_of_budget(state, call),
            sleep=lambda seconds: self._sleep(seconds, call),
        )
        try:
            return await retrying(attempt)
        except RetryError as exc:
            cause = exc.last_attempt.exception()
            elapsed = time.monotonic() - call.started
            log.warning(
                "LLM gave up on session %s after %d attempts in %.1fs: %s",
                llm_session.get(),
                call.attempts,
                elapsed,
                cause,
            )
            raise LLMUnavailable(
                f"LLM unavailable after {call.attempts} attempts in {elapsed:.1f}s: {cause}",
                last_cause=cause,
                attempts=call.attempts,
            ) from cause

    async def _attempt(self, prompt: str, call: _Call) -> str:
        async with self._semaphore:
            now = time.monotonic()
            if call.deadline is None:
                # Queueing for the first slot is backpressure, not failure:
                # the budget starts with the first attempt.
                call.deadline = now + self.retry_budget_s
            elif now >= call.deadline:  # spent queueing for a slot again
                raise LLMUnavailable(
                    f"LLM retry budget of {self.retry_budget_s:g}s spent: {call.last_error}",
                    last_cause=call.last_error,
                    attempts=call.attempts,
                )
            return await self._guarded(prompt, call)

    async def _guarded(self, prompt: str, call: _Call) -> str:
        probe = self.breaker.admit()  # raises BreakerOpen while open
        failed: bool | None = None  # None: the attempt says nothing about the endpoint
        call.attempts += 1  # counts calls made, not refusals by the breaker
        timeout_s = min(self.attempt_timeout_s, (call.deadline or 0.0) - time.monotonic())
        started = time.monotonic()
        LLM_IN_FLIGHT.inc()
        try:
            answer = await self._deadlines.run(timeout_s, self._llm(prompt))
            _check_answer(answer)
            failed = False
        except Exception as exc:
            failure = self._as_llm_error(exc, timeout_s)
            call.last_error = failure
            LLM_FAILURES.labels(failure.kind).inc()
            self.failures.failed(call.attempts, failure)
            # A bad request or key proves the endpoint up; a timeout we shortened to fit
            # the budget says little about it (test_non_retryable_error_raises_at_once).
            cut_short = isinstance(exc, TimeoutError) and timeout_s < self.attempt_timeout_s
            failed = None if cut_short else failure.retryable
            if failure is exc:
                raise
            raise failure from exc
        # CancelledError (shutdown, rebalance) leaves ``failed`` None: the breaker is not told.
        finally:
            LLM_IN_FLIGHT.dec()
            self.breaker.record(failed=failed, probe=probe)
        LLM_LATENCY.observe(time.monotonic() - started)
        return answer

    @staticmethod
    def _as_llm_error(exc: Exception, timeout_s: float) -> LLMError:
        if isinstance(exc, LLMError):
            return exc
        if isinstance(exc, TimeoutError):
            return LLMError(
                f"LLM attempt timed out after {timeout_s:.2f}s", retryable=True, kind="timeout"
            )
        # A user callable's own exception: assume it is transient.
        return LLMError(f"LLM callable raised {type(exc).__name__}: {exc}", retryable=True)

    def _wait(self, state: RetryCallState, call: _Call) -> float:
        exc = state.outcome.exception() if state.outcome else None
        call.wake_on_change = None
        if isinstance(exc, BreakerOpen):
            # Wait for the half-open time (plus a little jitter so waiters do not
            # arrive together), or less if the breaker changes state meanwhile.
            call.wake_on_change = exc.changed
            return exc.wait_s + random.uniform(0.0, min(0.25, self.breaker.reset_s / 10))
        wait = self._backoff(state)
        if isinstance(exc, LLMError) and exc.retry_after is not None:
            wait = max(wait, min(exc.retry_after, self.max_wait_s))
        return wait

    def _out_of_budget(self, state: RetryCallState, call: _Call) -> bool:
        # Stop now rather than sleep past the deadline only to give up after it.
        deadline = call.deadline if call.deadline is not None else call.started
        return time.monotonic() + state.upcoming_sleep >= deadline

    async def _sleep(self, seconds: float, call: _Call) -> None:
        changed = call.wake_on_change
        if changed is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await changed.wait()
