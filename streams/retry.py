"""Retry policies (tenacity) and the one ``Retry-After`` parser, for every caller that retries."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime

from tenacity import RetryCallState
from tenacity.wait import wait_base, wait_random_exponential

__all__ = ["backoff", "retry_after", "wait_hinted"]


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
