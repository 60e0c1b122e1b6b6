"""HTTP ingest: the connector's webhook POSTs -> the ``actions`` topic.

The body is a frame (the SSE ``data:`` JSON, ``{"type": "actions", ...}``, read
by :func:`schemas.connector.parse_frame`: no ``type``, 422), signed like
the SDK's ``WebhookReceiver``: ``X-Connector-Signature: sha256=<hex HMAC-SHA256
of the raw body>``. Unlike the SDK receiver, a 2xx is only returned once Kafka
acknowledged the payload, so a failed write makes the connector retry instead
of losing the batch.

Beside it, ``POST /intercom`` takes Intercom's conversation webhooks
(:mod:`agents.ingest.intercom`).

Standalone: ``agent-context ingest`` (``AC_INGEST_*`` plus the usual ``AC_*``
settings). Or mount :func:`create_ingest_app` into another aiohttp app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.ingest.bodies import INGEST_REQUESTS, BodyTooLarge, json_response, read_limited, reject
from agents.ingest.intercom import IntercomWebhookSettings, intercom_webhook
from agents.ingest.producer import (
    ActionsProducer,
    DeadLetterTarget,
    RawActionsWriter,
    dead_letter_writer,
    input_dead_letter,
)
from schemas import InvalidMessage
from schemas.connector import SIGNATURE_HEADER, parse_frame, verify
from streams.observe import metrics
from streams.settings import ConfigurationError, Settings, from_environment

__all__ = [
    "IngestSettings",
    "create_ingest_app",
    "ingest_app_from_settings",
    "load_ingest_settings",
    "optional_ingest_settings",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_BODY_BYTES = 1024 * 1024


class IngestSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AC_INGEST_", extra="ignore")

    secret: SecretStr | None = None
    # Without a secret anyone who can reach the port can inject actions, so
    # running unsigned has to be asked for explicitly.
    allow_unsigned: bool = False
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    max_body_bytes: int = Field(default=DEFAULT_MAX_BODY_BYTES, ge=1)
    produce_timeout_s: float = Field(default=10.0, gt=0)


def create_ingest_app(
    producer: RawActionsWriter,
    *,
    secret: str | SecretStr | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    dead_letters: DeadLetterTarget | None = None,
    produce_timeout_s: float = 10.0,
    manage_producer: bool = False,
    serve_actions: bool = True,
    intercom: IntercomWebhookSettings | None = None,
) -> web.Application:
    """An aiohttp app with ``POST /webhook`` and ``GET /healthz``, and ``POST /intercom``
    when ``intercom`` has a webhook secret (``producer`` must then have ``link()``).

    ``dead_letters`` defaults to ``producer`` (it must then have ``dead_letter()``,
    as :class:`ActionsProducer` does). ``secret=None`` disables signature checks.
    With ``manage_producer`` the app starts and stops ``producer`` with itself
    (also when mounted as a sub-app).
    """
    key = secret.get_secret_value() if isinstance(secret, SecretStr) else secret
    if key == "":
        # The SDK treats an empty secret as "accept everything"; make that explicit.
        raise ValueError("empty webhook secret: pass secret=None to disable signature checks")
    secret_bytes = key.encode() if key is not None else None
    write_dead_letter = dead_letter_writer(dead_letters if dead_letters is not None else producer)  # type: ignore[arg-type]

    async def dead_letter(body: bytes, reason: str) -> web.Response:
        letter = input_dead_letter(body, reason, stage="ingest", source="http")
        try:
            async with asyncio.timeout(produce_timeout_s):
                await write_dead_letter(letter)
        except Exception as exc:
            # The input must not vanish: without its dead letter the sender has to retry.
            log.error("ingest: dead letter not written (%s): %s", type(exc).__name__, reason)
            return reject(503, "unavailable", "could not record the invalid payload; retry")
        metrics.DEAD_LETTERS.labels("ingest", reason.split(":", 1)[0][:60]).inc()
        log.warning("ingest: dead-lettered invalid payload: %s", reason)
        return reject(422, "invalid", reason)

    async def webhook(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body_bytes:
            return reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")
        try:
            body = await read_limited(request, max_body_bytes)
        except BodyTooLarge:
            return reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")

        if secret_bytes is not None:
            given = request.headers.get(SIGNATURE_HEADER, "")
            if not given.startswith("sha256="):
                return reject(401, "unauthorized", f"missing or malformed {SIGNATURE_HEADER}")
            if not verify(secret_bytes, body, given):
                return reject(401, "unauthorized", f"invalid {SIGNATURE_HEADER}")

        try:
            frame = parse_frame(body)
        except InvalidMessage as exc:
            return await dead_letter(body, exc.reason)
        if frame.actions is None:
            INGEST_REQUESTS.labels("ignored").inc()
            reason = f"event type {frame.type!r} is not ingested"
            return json_response(202, {"status": "ignored", "reason": reason})
        payload = frame.actions

        try:
            async with asyncio.timeout(produce_timeout_s):
                # The original bytes, not a re-serialisation: fields we do not
                # model yet still reach the consumers.
                meta = await producer.add_raw(payload.session_id, body)
        except Exception as exc:
            log.error("ingest: produce failed (%s): %s", type(exc).__name__, exc)
            return reject(503, "unavailable", "Kafka did not acknowledge the payload; retry")
        INGEST_REQUESTS.labels("accepted").inc()
        answer: dict[str, Any] = {"status": "accepted", "actions": len(payload.actions)}
        if meta is not None and hasattr(meta, "partition"):
            answer.update(partition=meta.partition, offset=meta.offset)
        return json_response(202, answer)

    async def healthz(_: web.Request) -> web.Response:
        connected = getattr(producer, "connected", None)
        return json_response(200, {"status": "ok", "kafka_connected": connected})

    app = web.Application(client_max_size=max_body_bytes)
    if serve_actions:
        app.router.add_post("/webhook", webhook)
    app.router.add_get("/healthz", healthz)
    if intercom is not None and intercom.webhook_secret is not None:
        app.router.add_post(
            "/intercom",
            intercom_webhook(producer, intercom, max_body_bytes, produce_timeout_s),
        )

    if manage_producer:

        async def producer_lifecycle(_: web.Application) -> AsyncIterator[None]:
            start = getattr(producer, "start", None)
            if start is not None:
                try:
                    await start()
                except Exception as exc:  # keep serving: requests answer 503 meanwhile
                    log.warning("ingest: Kafka not reachable at start-up (%s)", exc)
            yield
            stop = getattr(producer, "stop", None)
            if stop is not None:
                await stop()

        app.cleanup_ctx.append(producer_lifecycle)
    return app


def load_ingest_settings() -> IngestSettings:
    ingest = from_environment(IngestSettings, "AC_INGEST_")
    if (
        not _actions_enabled(ingest)
        and from_environment(IntercomWebhookSettings, "AC_INTERCOM_").webhook_secret is None
    ):
        raise ConfigurationError(
            "AC_INGEST_SECRET is not set; set it, or AC_INGEST_ALLOW_UNSIGNED=true to accept "
            "unsigned webhooks (or only AC_INTERCOM_WEBHOOK_SECRET for Intercom's webhooks)"
        )
    return ingest


def _actions_enabled(ingest: IngestSettings) -> bool:
    return ingest.secret is not None or ingest.allow_unsigned


def optional_ingest_settings() -> IngestSettings | None:
    """The ingest settings when the operator enabled ingest in the worker, else ``None``."""
    ingest = from_environment(IngestSettings, "AC_INGEST_")
    if (
        not _actions_enabled(ingest)
        and from_environment(IntercomWebhookSettings, "AC_INTERCOM_").webhook_secret is None
    ):
        return None
    return ingest


def ingest_app_from_settings(settings: Settings, ingest: IngestSettings) -> web.Application:
    producer = ActionsProducer.from_settings(settings, ack_timeout_s=ingest.produce_timeout_s)
    return create_ingest_app(
        producer,
        secret=ingest.secret,
        max_body_bytes=ingest.max_body_bytes,
        produce_timeout_s=ingest.produce_timeout_s,
        manage_producer=True,
        serve_actions=_actions_enabled(ingest),
        intercom=from_environment(IntercomWebhookSettings, "AC_INTERCOM_"),
    )
