"""SSE bridge: a connector's event stream -> the ``actions`` topic.

Speaks the ``AsyncConnectorClient`` wire format (``GET url``, ``Accept:
text/event-stream``, ``Authorization: Bearer <token>``; ``heartbeat`` frames
skipped, ``data:`` JSON dispatched on ``type``) and fixes what the SDK client
gets wrong for a service:

* 401/403/404 are fatal (:class:`SSEBridgeFatal`) instead of retried forever;
* a read timeout detects a silently stalled stream (the SDK waits forever);
* a frame that is not valid JSON or not a valid payload becomes a dead letter;
* each payload is acknowledged by Kafka before the next frame is read, so a slow
  broker slows the reading down instead of losing events.

The connector has no resume (no event ids), so events sent while disconnected
are lost upstream; reconnecting quickly is all a client can do.

Standalone: ``python -m agents.sse_bridge`` (``AC_SSE_*`` plus ``AC_*`` settings).
"""

from __future__ import annotations

import asyncio
import logging
import random
import signal
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import httpx
import orjson
from httpx_sse import ServerSentEvent, SSEError, aconnect_sse
from prometheus_client import Counter
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import ActionsPayload, InvalidMessage, decode
from streams.dead_letters import dead_letter
from streams.errors import AgentContextError, stop_on_configuration_error
from streams.hooks import Hook, fire, load_callable
from streams.observe import metrics
from streams.producer import (
    ActionsProducer,
    DeadLetterTarget,
    ProduceError,
    RawActionsSink,
    dead_letter_writer,
)
from streams.settings import HttpURL, from_environment, load_settings

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
        producer: RawActionsSink,
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
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
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
        cls, settings: BridgeSettings, producer: RawActionsSink, **options: Any
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
        failures = 0
        try:
            async with httpx.AsyncClient(timeout=self._timeout, trust_env=False) as http:
                while not self._stopping.is_set():
                    delivered_before, connected_before = self.delivered, self.connections
                    cause = await self._one_connection(http)
                    if self.connections > connected_before:  # a drop, not a failed attempt
                        await fire(self._on_disconnect, "on_disconnect", cause)
                    if self._stopping.is_set():
                        break
                    # A connection that delivered something resets the backoff;
                    # one that connects and drops at once keeps growing it.
                    failures = 1 if self.delivered > delivered_before else failures + 1
                    delay = self._backoff(failures)
                    SSE_RECONNECTS.labels(cause).inc()
                    log.warning(
                        "sse: %s from %s; reconnecting in %.1fs", cause, self._safe_url, delay
                    )
                    try:
                        await asyncio.wait_for(self._stopping.wait(), delay)
                    except TimeoutError:
                        pass
        finally:
            self._running = False
        log.info("sse: bridge stopped (%s)", self._safe_url)

    def _backoff(self, failures: int) -> float:
        # Equal jitter: at least half the exponential step, so a fleet of bridges
        # spreads out without any of them hammering the connector.
        step = min(self._max_backoff_s, self._initial_backoff_s * 2 ** (failures - 1))
        return step / 2 + random.uniform(0, step / 2)

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
            data = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            await self._dead_letter(raw, f"not valid JSON: {exc}")
            return
        if not isinstance(data, dict):
            await self._dead_letter(raw, f"not a JSON object: {type(data).__name__}")
            return
        kind = data.get("type")
        if kind != "actions":
            SSE_EVENTS.labels("ignored").inc()
            log.debug("sse: ignoring event type %r", kind)
            return
        try:
            payload = decode(ActionsPayload, raw)
        except InvalidMessage as exc:
            key = data.get("session_id") if isinstance(data.get("session_id"), str) else None
            await self._dead_letter(raw, exc.reason, key or None)
            return
        if await self._until_acknowledged(lambda: self._producer.add_raw(payload.session_id, raw)):
            self.delivered += 1
            SSE_EVENTS.labels("delivered").inc()

    async def _dead_letter(self, raw: bytes, reason: str, key: str | None = None) -> None:
        letter = dead_letter(reason, "sse", raw, source_topic="sse", key=key)
        if await self._until_acknowledged(lambda: self._write_dead_letter(letter)):
            self.dead_lettered += 1
            SSE_EVENTS.labels("dead_letter").inc()
            metrics.DEAD_LETTERS.labels("sse", reason.split(":", 1)[0][:60]).inc()
            log.warning("sse: dead-lettered a frame: %s", reason)

    async def _until_acknowledged(self, produce: Callable[[], Awaitable[Any]]) -> bool:
        """Retry a produce until Kafka acknowledges it (the stream has no redelivery).

        False only if :meth:`stop` was called while Kafka kept failing: the event is lost.
        """
        failures = 0
        while True:
            try:
                await produce()
                return True
            except ProduceError as exc:
                failures += 1
                if self._stopping.is_set():
                    log.error("sse: stopped with an event Kafka never acknowledged: %s", exc)
                    return False
                delay = self._backoff(failures)
                log.warning("sse: %s; retrying the produce in %.1fs", exc, delay)
                try:
                    await asyncio.wait_for(self._stopping.wait(), delay)
                except TimeoutError:
                    pass


class _RetryableStatus(AgentContextError):
    """A non-2xx answer worth retrying (5xx, 429, ...)."""


async def _serve(settings: BridgeSettings) -> None:
    async with ActionsProducer.from_settings(load_settings()) as producer:
        bridge = SSEBridge.from_settings(settings, producer)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, bridge.stop)
        await bridge.run()


@stop_on_configuration_error()
def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = from_environment(BridgeSettings, "AC_SSE_")
    asyncio.run(_serve(settings))


if __name__ == "__main__":
    main()
