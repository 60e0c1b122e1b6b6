"""Retry policies (tenacity) and the one ``Retry-After`` parser, for every caller that retries."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt
from tenacity.stop import stop_never
from tenacity.wait import wait_base, wait_random_exponential

__all__ = ["backoff", "retry_after", "retry_call", "wait_hinted"]

T = TypeVar("T")


async def retry_call(
    fn: Callable[[], Awaitable[T]],
    *,
    retry: Callable[[BaseException], bool],
    wait: Callable[[RetryCallState], float],
    attempts: int | None = None,
    before_sleep: Callable[[RetryCallState], Any] | None = None,
) -> T:
    """``await fn()``, retried under tenacity while ``retry(error)`` holds, at most
    ``attempts`` times (None: until it succeeds), waiting ``wait`` between attempts.

    The first attempt runs outside tenacity, whose set-up costs ~100 µs a call even
    when nothing fails (half an HTTP sink's request); a failure of it is handed to
    tenacity as its attempt 1, so numbering, backoff and ``before_sleep`` are as usual.
    """
    try:
        return await fn()
    except Exception as exc:
        if not retry(exc) or attempts == 1:
            raise
        failed: BaseException | None = exc

    async def attempt() -> T:
        nonlocal failed
        if failed is not None:
            error, failed = failed, None
            raise error  # the bare attempt's failure, not a new call
        return await fn()

    retrying = AsyncRetrying(
        stop=stop_never if attempts is None else stop_after_attempt(attempts),
        wait=wait,
        retry=retry_if_exception(retry),
        before_sleep=before_sleep,
        reraise=True,
    )
    return await retrying(attempt)


def backoff(initial_s: float, max_s: float) -> wait_base:
    """Full-jitter exponential backoff: a random wait up to ``initial_s * 2**(n-1)``, capped,
    so callers that failed together don't retry together."""
    return wait_random_exponential(multiplier=initial_s, max=max_s)


def wait_hinted(
    base: Callable[[RetryCallState], float], hint: Callable[[BaseException], float | None]
) -> Callable[[RetryCallState], float]:
    """``base``'s wait, but never shorter than what the failure asked for (``hint``:
    a server's ``Retry-After``, already capped by the caller)."""

    def wait(state: RetryCallState) -> float:
        delay = base(state)
        error = state.outcome.exception() if state.outcome is not None else None
        asked = hint(error) if error is not None else None
        return max(delay, asked) if asked is not None else delay

    return wait


def retry_after(
    headers: Mapping[str, str], *, now: float | None = None, reset_header: str | None = None
) -> float | None:
    """Seconds the server asked us to wait, or None when it said nothing usable.

    Read in order: ``reset_header`` if given (a Unix time in whole seconds, such as
    Intercom's ``X-RateLimit-Reset``: a reset "now" still means this second, so at
    least 0.05 s), ``retry-after-ms``, then ``Retry-After`` (seconds or an HTTP date).
    """
    lowered = {key.lower(): value for key, value in headers.items()}
    now = time.time() if now is None else now
    if reset_header and (reset := lowered.get(reset_header.lower())):
        try:
            return max(float(reset) - now, 0.05)
        except ValueError:
            pass
    if millis := lowered.get("retry-after-ms"):
        try:
            return max(float(millis) / 1000.0, 0.0)
        except ValueError:
            pass
    value = (lowered.get("retry-after") or "").strip()
    if not value:
        return None
    try:
        return max(float(value), 0.0)
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT; an unzoned one is not an HTTP date
        return None
    return max(when.timestamp() - now, 0.0)
