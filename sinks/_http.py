"""The one HTTP delivery helper of the HTTP sinks (Intercom, webhook): :class:`Destination`.

What they add over a bare ``httpx`` call, and why:

- **Rate limits are honoured for the whole destination**, not per request: a
  429 closes a :class:`RateLimitGate` until ``X-RateLimit-Reset`` (epoch
  seconds) or ``Retry-After`` (seconds or an HTTP date), and every request to
  that destination waits at the gate. Hammering a rate-limited API from many
  session lanes at once only prolongs the limit.
- **Transient failures are retried a few times, fast**, inside the call (429,
  5xx, 408, timeouts, connection errors), by the tenacity policy of
  :mod:`streams.retry` (jittered backoff, never shorter than the server asked).
  After that a :class:`TransientHTTPError`
  is raised: the sink runner retries the operation with capped backoff, and the
  session's lane waits meanwhile, so order is kept.
- **A request that may have been applied is never blindly repeated** unless the
  caller says the request is idempotent. A timeout or a 5xx after the request
  was sent leaves the outcome unknown (a note posted but never recorded). For
  such requests :meth:`Destination.send` raises at once with
  ``maybe_delivered=True``, so the caller can look at the destination before
  trying again.
- **No secrets in errors**: messages carry the method, the path and the status
  (plus a short error code from the body), with any known secret scrubbed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable
from typing import Annotated, Any

import httpx
from pydantic import AfterValidator, SecretStr

from streams.errors import AgentContextError
from streams.retry import backoff, retry_after, retry_call, wait_hinted

__all__ = [
    "RETRYABLE_STATUSES",
    "Destination",
    "NonBlankSecret",
    "RateLimitGate",
    "TransientHTTPError",
    "describe",
    "quiet_httpx_logging",
    "scrub",
]

log = logging.getLogger(__name__)

# Retried besides 429 and every 5xx. 409 is in the default set because Intercom
# answers it for a conflicting concurrent change; a webhook receiver that uses
# 409 for "duplicate Idempotency-Key" passes a set without it.
RETRYABLE_STATUSES = frozenset({408, 409, 425})
MAX_RATE_LIMIT_WAIT_S = 120.0


def _not_blank(value: SecretStr) -> SecretStr:
    # Blank: no credentials at all, or (a webhook secret) a signature anyone can make.
    if not value.get_secret_value().strip():
        raise ValueError("must not be empty")
    return value


NonBlankSecret = Annotated[SecretStr, AfterValidator(_not_blank)]
"""A token or signing secret: blank is refused at start-up."""


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
    request that is not idempotent. ``retry_after``: seconds the destination asked
    us to wait (a 429), capped.
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        maybe_delivered: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.maybe_delivered = maybe_delivered
        self.retry_after = retry_after


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every non-trivial secret replaced by ``***``."""
    for secret in secrets:
        if secret and len(secret) >= 4:
            text = text.replace(secret, "***")
    return text


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


class Destination:
    """One HTTP destination of a sink: its client, its rate-limit gate (shared by all
    the session lanes), its cap on requests in flight, and :meth:`send`."""

    def __init__(
        self,
        *,
        label: str,
        timeout_s: float,
        max_concurrency: int,
        attempts: int,
        secrets: Iterable[str] = (),
        retry_statuses: frozenset[int] = RETRYABLE_STATUSES,
        headers: dict[str, str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        **client: Any,
    ) -> None:
        quiet_httpx_logging()
        self.label, self.attempts, self.retry_statuses = label, attempts, retry_statuses
        self.secrets = tuple(secrets)
        self.client = httpx.AsyncClient(
            timeout=timeout_s,
            headers={"User-Agent": "agent-context-streams", **(headers or {})},
            limits=httpx.Limits(max_connections=max_concurrency * 2),
            transport=transport,
            **client,
        )
        self.gate = RateLimitGate()
        self._max_concurrency = max_concurrency
        self._slots: asyncio.Semaphore | None = None  # made in the running loop

    def error(self, method: str, url: str, response: httpx.Response | None = None) -> str:
        """``<label> <method> <path>: HTTP <status> (<code>)``, secrets scrubbed."""
        return scrub(f"{self.label} {describe(method, url, response)}", self.secrets)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def send(
        self,
        method: str,
        url: str,
        *,
        idempotent: bool,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        **kwargs: Any,
    ) -> httpx.Response:
        """Send with the retries described above; returns any non-retryable response.

        The caller decides what a 4xx means; every retryable outcome that outlasts
        ``attempts`` raises :class:`TransientHTTPError`.
        """
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._max_concurrency)

        async def attempt() -> httpx.Response:
            await self.gate.wait()
            try:
                response = await self.client.request(method, url, **kwargs)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                # Never reached the destination: safe to repeat.
                raise TransientHTTPError(
                    f"{self.error(method, url)}: {type(exc).__name__}"
                ) from None
            except (httpx.TimeoutException, httpx.TransportError) as exc:
                text = f"{self.error(method, url)}: {type(exc).__name__}"
                raise TransientHTTPError(text, maybe_delivered=True) from None
            status = response.status_code
            if status != 429 and status < 500 and status not in self.retry_statuses:
                return response
            text = self.error(method, url, response)
            if status == 429:
                delay = retry_after(response.headers, reset_header="x-ratelimit-reset")
                delay = min(1.0 if delay is None else delay, MAX_RATE_LIMIT_WAIT_S)
                self.gate.close_for(delay)
                log.info("%s; rate limited, waiting %.2fs", text, delay)
                raise TransientHTTPError(text, status=status, retry_after=delay)
            raise TransientHTTPError(text, status=status, maybe_delivered=status >= 500)

        def retryable(exc: BaseException) -> bool:
            # A request that may have been applied is repeated only when that is harmless.
            return isinstance(exc, TransientHTTPError) and (idempotent or not exc.maybe_delivered)

        async with self._slots:
            return await retry_call(
                attempt,
                retry=retryable,
                wait=wait_hinted(backoff(backoff_s, max_backoff_s), _asked_wait),
                attempts=max(self.attempts, 1),
            )


def _asked_wait(exc: BaseException) -> float | None:
    return exc.retry_after if isinstance(exc, TransientHTTPError) else None
