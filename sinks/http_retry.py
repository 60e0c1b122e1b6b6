"""HTTP delivery helpers shared by the HTTP sinks (Intercom, webhook).

What they add over a bare ``httpx`` call, and why:

- **Rate limits are honoured for the whole destination**, not per request: a
  429 closes a :class:`RateLimitGate` until ``X-RateLimit-Reset`` (epoch
  seconds) or ``Retry-After`` (seconds or an HTTP date), and every request to
  that destination waits at the gate. Hammering a rate-limited API from many
  session lanes at once only prolongs the limit.
- **Transient failures are retried a few times, fast**, inside the call (429,
  5xx, 408, timeouts, connection errors). After that a :class:`TransientHTTPError`
  is raised: the sink runner retries the operation with capped backoff, and the
  session's lane waits meanwhile, so order is kept.
- **A request that may have been applied is never blindly repeated** unless the
  caller says the request is idempotent. A timeout or a 5xx after the request
  was sent leaves the outcome unknown (the SDK's D3: a note posted but never
  recorded). For such requests :func:`send` raises at once with
  ``maybe_delivered=True``, so the caller can look at the destination before
  trying again.
- **No secrets in errors**: messages carry the method, the path and the status
  (plus a short error code from the body), with any known secret scrubbed.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import random
import time
from collections.abc import Iterable, Mapping
from typing import Any

import httpx

from streams.errors import AgentContextError

__all__ = [
    "RETRYABLE_STATUSES",
    "RateLimitGate",
    "TransientHTTPError",
    "quiet_httpx_logging",
    "retry_delay",
    "scrub",
    "send",
]

log = logging.getLogger(__name__)

# Retried besides 429 and every 5xx. 409 is in the default set because Intercom
# answers it for a conflicting concurrent change; a webhook receiver that uses
# 409 for "duplicate Idempotency-Key" passes a set without it.
RETRYABLE_STATUSES = frozenset({408, 409, 425})
MAX_RATE_LIMIT_WAIT_S = 120.0


def quiet_httpx_logging() -> None:
    """httpx logs every request at INFO; a sink worker makes thousands. Keep WARNING
    and up, unless the user configured the ``httpx`` logger's level themselves."""
    logger = logging.getLogger("httpx")
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)


class TransientHTTPError(AgentContextError):
    """The destination did not take the request this time; retry it later.

    ``maybe_delivered`` is true when the request may have been applied anyway
    (a timeout or a 5xx after the request was sent): check before repeating a
    request that is not idempotent.
    """

    def __init__(
        self, message: str, *, status: int | None = None, maybe_delivered: bool = False
    ) -> None:
        super().__init__(message)
        self.status = status
        self.maybe_delivered = maybe_delivered


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-trivial secret replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


def retry_delay(
    headers: Mapping[str, str], *, now: float | None = None, default: float = 1.0
) -> float:
    """Seconds to wait after a 429, from ``X-RateLimit-Reset`` or ``Retry-After``.

    ``X-RateLimit-Reset`` is a Unix timestamp in whole seconds (Intercom), so a
    reset "now" still means the current second: wait at least a little.
    """
    now = time.time() if now is None else now
    reset = headers.get("x-ratelimit-reset")
    if reset:
        try:
            return min(max(float(reset) - now, 0.05), MAX_RATE_LIMIT_WAIT_S)
        except ValueError:
            pass
    after = headers.get("retry-after")
    if after:
        try:
            return min(max(float(after), 0.0), MAX_RATE_LIMIT_WAIT_S)
        except ValueError:
            parsed = email.utils.parsedate_to_datetime(after) if after.strip() else None
            if parsed is not None:
                return min(max(parsed.timestamp() - now, 0.0), MAX_RATE_LIMIT_WAIT_S)
    return default


class RateLimitGate:
    """Closed after a 429 until the destination's window resets; shared by all lanes."""

    def __init__(self) -> None:
        self._open_at = 0.0  # time.monotonic()

    def close_for(self, seconds: float) -> None:
        self._open_at = max(self._open_at, time.monotonic() + seconds)

    @property
    def closed_for(self) -> float:
        return max(self._open_at - time.monotonic(), 0.0)

    async def wait(self) -> None:
        # A loop, not an Event: another 429 may move the reopening time while we wait.
        while (delay := self.closed_for) > 0:  # noqa: ASYNC110
            # A little jitter so the lanes don't all fire in the same millisecond.
            await asyncio.sleep(delay + random.uniform(0, 0.05))


def _error_code(response: httpx.Response) -> str:
    """A short machine code from an error body (Intercom: ``errors[0].code``), if any."""
    try:
        body = response.json()
    except ValueError:
        return ""
    if isinstance(body, dict):
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("code") or "")[:80]
        error = body.get("error")
        if isinstance(error, dict):
            return str(error.get("code") or error.get("type") or "")[:80]
    return ""


def describe(method: str, url: httpx.URL | str, response: httpx.Response | None = None) -> str:
    path = httpx.URL(str(url)).path
    if response is None:
        return f"{method} {path}"
    code = _error_code(response) if response.status_code >= 400 else ""
    reason = f" ({code})" if code else ""
    return f"{method} {path}: HTTP {response.status_code}{reason}"


async def send(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    gate: RateLimitGate,
    idempotent: bool,
    attempts: int = 4,
    backoff_s: float = 0.2,
    max_backoff_s: float = 5.0,
    retry_statuses: frozenset[int] = RETRYABLE_STATUSES,
    secrets: Iterable[str] = (),
    label: str = "",
    **kwargs: Any,
) -> httpx.Response:
    """Send with the retries described above; returns any non-retryable response.

    The caller decides what a 4xx means; every retryable outcome that outlasts
    ``attempts`` raises :class:`TransientHTTPError`.
    """
    secrets = tuple(secrets)
    last: TransientHTTPError | None = None
    for attempt in range(1, max(attempts, 1) + 1):
        await gate.wait()
        try:
            response = await client.request(method, url, **kwargs)
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # Never reached the destination: safe to repeat.
            last = TransientHTTPError(
                scrub(f"{label}{describe(method, url)}: {type(exc).__name__}", secrets)
            )
        except (httpx.TimeoutException, httpx.TransportError) as exc:
            last = TransientHTTPError(
                scrub(f"{label}{describe(method, url)}: {type(exc).__name__}", secrets),
                maybe_delivered=True,
            )
            if not idempotent:
                raise last from None
        else:
            status = response.status_code
            if status != 429 and status < 500 and status not in retry_statuses:
                return response
            text = scrub(f"{label}{describe(method, url, response)}", secrets)
            if status == 429:
                delay = retry_delay(response.headers)
                gate.close_for(delay)
                log.info("%s; rate limited, waiting %.2fs", text, delay)
                last = TransientHTTPError(text, status=status)
                continue  # the gate does the waiting
            maybe = status >= 500
            last = TransientHTTPError(text, status=status, maybe_delivered=maybe)
            if maybe and not idempotent:
                raise last
        if attempt < attempts:
            delay = min(backoff_s * 2 ** (attempt - 1), max_backoff_s)
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
    assert last is not None
    raise last
