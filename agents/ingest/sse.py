"""SSE bridge: a connector's event stream -> the ``actions`` topic.

Speaks the ``AsyncConnectorClient`` wire format (``GET url``, ``Accept:
text/event-stream``, ``Authorization: Bearer <token>``; ``heartbeat`` frames
skipped, ``data:`` JSON read by :func:`schemas.connector.parse_frame`) and fixes
what the SDK client gets wrong for a service:

* 401/403/404 are fatal (:class:`SSEBridgeFatal`) instead of retried forever;
* a read timeout detects a silently stalled stream (the SDK waits forever);
* a malformed frame (not JSON, no ``type``, an invalid payload) becomes a dead letter;
* each payload is acknowledged by Kafka before the next frame is read, so a slow
  broker slows the reading down instead of losing events.

The connector has no resume (no event ids), so events sent while disconnected
are lost upstream; reconnecting quickly is all a client can do.

Standalone: ``agent-context sse-bridge`` (``AC_SSE_*`` plus ``AC_*`` settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse
from prometheus_client import Counter
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type
from tenacity.wait import wait_base

from agents.ingest.producer import (
    DeadLetterTarget,
    ProduceError,
    RawActionsWriter,
    dead_letter_writer,
    input_dead_letter,
)
from schemas import InvalidMessage
from schemas.connector import parse_frame
from streams.errors import AgentContextError
from streams.hooks import Hook, fire, load_callable
from streams.observe import metrics
from streams.settings import HttpURL

__all__ = ["BridgeSettings", "SSEBridge", "SSEBridgeFatal"]

log = logging.getLogger(__name__)

SSE_EVENTS = Counter("ac_sse_events_total", "SSE frames read by the bridge", ["outcome"])
SSE_RECONNECTS = Counter("ac_sse_reconnects_total", "SSE reconnects", ["cause"])

_FATAL_STATUS = (401, 403, 404)


class SSEBridgeFatal(AgentContextError, RuntimeError):
    """A condition retrying cannot fix (bad token, wrong URL); the bridge stops."""


class BridgeSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AC_SSE_", extra="ignore")

    url: HttpURL
    token: SecretStr | None = None
    read_timeout_s: float = Field(default=60.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    initial_backoff_s: float = Field(default=1.0, gt=0)
    max_backoff_s: float = Field(default=30.0, gt=0)
    # Dotted paths of the SDK's ``on_connect()`` / ``on_disconnect(reason)`` callables.
    on_connect: str | None = None
    on_disconnect: str | None = None


def _redact(url: str) -> str:
    """scheme://host/path only: a query string or userinfo may carry credentials."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"


class SSEBridge:
    """Read one connector stream and produce its ``actions`` events into Kafka."""

    def __init__(
        self,
        producer: RawActionsWriter,
        *,
        url: str,
        token: str | SecretStr | None = None,
        read_timeout_s: float = 60.0,
        connect_timeout_s: float = 10.0,
        initial_backoff_s: float = 1.0,
        max_backoff_s: float = 30.0,
        dead_letters: DeadLetterTarget | None = None,
        on_connect: Hook | None = None,
        on_disconnect: Hook | None = None,
    ) -> None:
        if initial_backoff_s <= 0 or max_backoff_s < initial_backoff_s:
            raise ValueError("need 0 < initial_backoff_s <= max_backoff_s")
        self._producer = producer
        self._write_dead_letter = dead_letter_writer(
            dead_letters if dead_letters is not None else producer  # type: ignore[arg-type]
        )
        self._url = url
        self._safe_url = _redact(url)
        self._token = token if isinstance(token, SecretStr) or token is None else SecretStr(token)
        self._timeout = httpx.Timeout(
            connect=connect_timeout_s, read=read_timeout_s, write=10.0, pool=connect_timeout_s
        )
        self._jitter = _EqualJitter(initial_backoff_s, max_backoff_s)
        self._productive_attempt = 0
        self._on_connect, self._on_disconnect = on_connect, on_disconnect
        self._stopping = asyncio.Event()
        self._stream_task: asyncio.Task[None] | None = None
        self._dispatching = False
        self._running = False
        # Observable counters (tests, health checks).
        self.connections = 0
        self.delivered = 0
        self.dead_lettered = 0
        self.read_timeouts = 0

    @classmethod
    def from_settings(
        cls, settings: BridgeSettings, producer: RawActionsWriter, **options: Any
    ) -> SSEBridge:
        return cls(
            producer,
            url=settings.url,
            token=settings.token,
            read_timeout_s=settings.read_timeout_s,
            connect_timeout_s=settings.connect_timeout_s,
            initial_backoff_s=settings.initial_backoff_s,
            max_backoff_s=settings.max_backoff_s,
            on_connect=load_callable(settings.on_connect, "AC_SSE_ON_CONNECT"),
            on_disconnect=load_callable(settings.on_disconnect, "AC_SSE_ON_DISCONNECT"),
            **options,
        )

    def __repr__(self) -> str:  # never the token
        return f"SSEBridge(url={self._safe_url!r}, connections={self.connections})"

    def stop(self) -> None:
        """Make :meth:`run` return; a payload being produced is finished first."""
        self._stopping.set()
        if self._stream_task is not None and not self._dispatching:
            self._stream_task.cancel()  # only ever interrupts a network wait

    async def run(self) -> None:
        """Stream, reconnecting with capped exponential backoff, until :meth:`stop`."""
        if self._running:
            raise RuntimeError("SSEBridge.run() is already running")
        self._running = True
        self._stopping.clear()
        self._productive_attempt = 0
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_Dropped),
            wait=self._reconnect_wait,
            stop=lambda _: self._stopping.is_set(),
            sleep=self._pause,
            before_sleep=self._reconnecting,
            reraise=True,
        )
        try:
            async with httpx.AsyncClient(timeout=self._timeout, trust_env=False) as http:
                with contextlib.suppress(_Dropped):  # raised again once stop() was called
                    async for attempt in retrying:
                        with attempt:
                            await self._connection(http, attempt.retry_state.attempt_number)
        finally:
            self._running = False
        log.info("sse: bridge stopped (%s)", self._safe_url)

    async def _connection(self, http: httpx.AsyncClient, attempt: int) -> None:
        """One connection; raises :class:`_Dropped` when it ends and was not stopped."""
        if self._stopping.is_set():
            return
        delivered_before, connected_before = self.delivered, self.connections
        cause = await self._one_connection(http)
        if self.connections > connected_before:  # a drop, not a failed attempt
            await fire(self._on_disconnect, "on_disconnect", cause)
        if self._stopping.is_set():
            return
        if self.delivered > delivered_before:
            self._productive_attempt = attempt - 1
        raise _Dropped(cause)

    def _reconnect_wait(self, state: RetryCallState) -> float:
        # A connection that delivered something restarts the backoff at its first
        # step; one that connects and drops at once keeps growing it.
        failures = state.attempt_number - self._productive_attempt
        return self._jitter.delay(failures)

    def _reconnecting(self, state: RetryCallState) -> None:
        cause = str(_error(state))
        delay = state.next_action.sleep if state.next_action else 0.0
        SSE_RECONNECTS.labels(cause).inc()
        log.warning("sse: %s from %s; reconnecting in %.1fs", cause, self._safe_url, delay)

    async def _one_connection(self, http: httpx.AsyncClient) -> str:
        """Run one connection to its end; return why it ended. Raises SSEBridgeFatal."""
        self._stream_task = asyncio.create_task(self._stream(http))
        try:
            await self._stream_task
            return "stream ended"
        except asyncio.CancelledError:
            if self._stopping.is_set():
                return "stopped"
            raise  # run() itself was cancelled
        except httpx.ReadTimeout:
            self.read_timeouts += 1
            return "read timeout (stalled stream)"
        except (httpx.HTTPError, SSEError, _RetryableStatus) as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._stream_task = None

    async def _stream(self, http: httpx.AsyncClient) -> None:
        headers = {"Accept": "text/event-stream"}
        if self._token is not None and self._token.get_secret_value().strip():
            headers["Authorization"] = f"Bearer {self._token.get_secret_value().strip()}"
        async with aconnect_sse(http, "GET", self._url, headers=headers) as source:
            status = source.response.status_code
            if status in _FATAL_STATUS:
                raise SSEBridgeFatal(
                    f"connector answered HTTP {status} for {self._safe_url}: check URL and token"
                )
            if not 200 <= status < 300:
                raise _RetryableStatus(f"HTTP {status}")
            self.connections += 1
            log.info("sse: connected to %s", self._safe_url)
            await fire(self._on_connect, "on_connect")
            async for sse in source.aiter_sse():
                self._dispatching = True
                try:
                    await self._handle(sse)
                finally:
                    self._dispatching = False
                if self._stopping.is_set():
                    return

    async def _handle(self, sse: ServerSentEvent) -> None:
        if sse.event == "heartbeat":
            SSE_EVENTS.labels("heartbeat").inc()
            return
        if not sse.data:
            return
        raw = sse.data.encode("utf-8")
        try:
            frame = parse_frame(raw)
        except InvalidMessage as exc:
            await self._dead_letter(raw, exc.reason)
            return
        if frame.actions is None:
            SSE_EVENTS.labels("ignored").inc()
            log.debug("sse: ignoring event type %r", frame.type)
            return
        payload = frame.actions
        if await self._until_acknowledged(lambda: self._producer.add_raw(payload.session_id, raw)):
            self.delivered += 1
            SSE_EVENTS.labels("delivered").inc()

    async def _dead_letter(self, raw: bytes, reason: str) -> None:
        letter = input_dead_letter(raw, reason, stage="sse", source="sse")
        if await self._until_acknowledged(lambda: self._write_dead_letter(letter)):
            self.dead_lettered += 1
            SSE_EVENTS.labels("dead_letter").inc()
            metrics.DEAD_LETTERS.labels("sse", reason.split(":", 1)[0][:60]).inc()
            log.warning("sse: dead-lettered a frame: %s", reason)

    async def _until_acknowledged(self, produce: Callable[[], Awaitable[Any]]) -> bool:
        """Retry a produce until Kafka acknowledges it (the stream has no redelivery).

        False only if :meth:`stop` was called while Kafka kept failing: the event is lost.
        """

        def retrying_in(state: RetryCallState) -> None:
            delay = state.next_action.sleep if state.next_action else 0.0
            log.warning("sse: %s; retrying the produce in %.1fs", _error(state), delay)

        retrying = AsyncRetrying(
            retry=retry_if_exception_type(ProduceError),
            wait=self._jitter,
            stop=lambda _: self._stopping.is_set(),
            sleep=self._pause,
            before_sleep=retrying_in,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await produce()
        except ProduceError as exc:
            log.error("sse: stopped with an event Kafka never acknowledged: %s", exc)
            return False
        return True

    async def _pause(self, seconds: float) -> None:
        """Sleep, but wake up at once when :meth:`stop` is called."""
        try:
            await asyncio.wait_for(self._stopping.wait(), seconds)
        except TimeoutError:
            pass


def _error(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome is not None else None


class _EqualJitter(wait_base):
    """At least half the capped exponential step: a fleet of bridges spreads out
    without any of them hammering the connector (or the broker)."""

    def __init__(self, initial_s: float, max_s: float) -> None:
        self.initial_s, self.max_s = initial_s, max_s

    def __call__(self, retry_state: RetryCallState) -> float:
        return self.delay(retry_state.attempt_number)

    def delay(self, failures: int) -> float:
        step = min(self.max_s, self.initial_s * 2 ** (failures - 1))
        return step / 2 + random.uniform(0, step / 2)


class _RetryableStatus(AgentContextError):
    """A non-2xx answer worth retrying (5xx, 429, ...)."""


class _Dropped(AgentContextError):
    """A connection ended (its cause is the message); the bridge reconnects."""
