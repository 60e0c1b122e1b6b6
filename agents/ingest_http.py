"""HTTP ingest: the connector's webhook POSTs -> the ``actions`` topic.

The body is the SSE ``data:`` JSON (``{"type": "actions", ...}``), signed like
the SDK's ``WebhookReceiver``: ``X-Connector-Signature: sha256=<hex HMAC-SHA256
of the raw body>``. Unlike the SDK receiver, a 2xx is only returned once Kafka
acknowledged the payload, so a failed write makes the connector retry instead
of losing the batch.

Beside it, ``POST /intercom`` takes Intercom's conversation webhooks (signed
``X-Hub-Signature: sha1=<hex HMAC-SHA1>`` with the app's client secret,
``AC_INTERCOM_WEBHOOK_SECRET``): a conversation that names a session in its
custom attribute ``AC_INTERCOM_SESSION_ATTRIBUTE`` links that session to it.

Standalone: ``python -m agents.ingest_http`` (``AC_INGEST_*`` plus the usual
``AC_*`` settings). Or mount :func:`create_ingest_app` into another aiohttp app.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any

import orjson
from aiohttp import web
from prometheus_client import Counter
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import ActionsPayload, InvalidMessage, decode
from streams import signing
from streams.dead_letters import dead_letter as new_dead_letter
from streams.errors import AgentContextError, stop_on_configuration_error
from streams.observe import metrics
from streams.producer import (
    ActionsProducer,
    DeadLetterTarget,
    RawActionsSink,
    dead_letter_writer,
)
from streams.settings import ConfigurationError, Settings, from_environment, load_settings
from streams.topics import ensure_topics

__all__ = [
    "INTERCOM_SIGNATURE_HEADER",
    "SIGNATURE_HEADER",
    "IngestSettings",
    "IntercomWebhookSettings",
    "create_ingest_app",
    "sign",
]

log = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Connector-Signature"
INTERCOM_SIGNATURE_HEADER = "X-Hub-Signature"
DEFAULT_MAX_BODY_BYTES = 1024 * 1024

INGEST_REQUESTS = Counter("ac_ingest_requests_total", "Webhook ingest requests", ["outcome"])


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


class IntercomWebhookSettings(BaseSettings):
    """``AC_INTERCOM_WEBHOOK_SECRET`` (the Intercom app's client secret) turns the route on."""

    model_config = SettingsConfigDict(env_prefix="AC_INTERCOM_", extra="ignore")

    webhook_secret: SecretStr | None = None
    session_attribute: str = Field(default="session_id", min_length=1)


def sign(secret: str, body: bytes) -> str:
    """The header value the connector sends for ``body``."""
    return signing.sign(secret, body)


def _json(code: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def _reject(status: int, outcome: str, reason: str) -> web.Response:
    INGEST_REQUESTS.labels(outcome).inc()
    return _json(status, {"error": reason})


class _TooLarge(AgentContextError):
    pass


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes: Content-Length can be absent (chunked) or lie."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    return b"".join(chunks)


def _session_hint(data: Any) -> str | None:
    """The session of an invalid payload, if it names one, to key its dead letter."""
    if isinstance(data, dict) and isinstance(data.get("session_id"), str):
        return data["session_id"] or None
    return None


def create_ingest_app(
    producer: RawActionsSink,
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

    async def dead_letter(body: bytes, reason: str, data: Any = None) -> web.Response:
        letter = new_dead_letter(
            reason, "ingest", body, source_topic="http", key=_session_hint(data)
        )
        try:
            async with asyncio.timeout(produce_timeout_s):
                await write_dead_letter(letter)
        except Exception as exc:
            # The input must not vanish: without its dead letter the sender has to retry.
            log.error("ingest: dead letter not written (%s): %s", type(exc).__name__, reason)
            return _reject(503, "unavailable", "could not record the invalid payload; retry")
        metrics.DEAD_LETTERS.labels("ingest", reason.split(":", 1)[0][:60]).inc()
        log.warning("ingest: dead-lettered invalid payload: %s", reason)
        return _reject(422, "invalid", reason)

    async def webhook(request: web.Request) -> web.Response:
        if request.content_length is not None and request.content_length > max_body_bytes:
            return _reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")
        try:
            body = await _read_limited(request, max_body_bytes)
        except _TooLarge:
            return _reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")

        if secret_bytes is not None:
            given = request.headers.get(SIGNATURE_HEADER, "")
            if not given.startswith("sha256="):
                return _reject(401, "unauthorized", f"missing or malformed {SIGNATURE_HEADER}")
            if not signing.verify(secret_bytes, body, given):
                return _reject(401, "unauthorized", f"invalid {SIGNATURE_HEADER}")

        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            return await dead_letter(body, f"not valid JSON: {exc}")
        if not isinstance(data, dict):
            return await dead_letter(body, f"not a JSON object: {type(data).__name__}", data)
        kind = data.get("type")
        if kind is None:
            return await dead_letter(body, "missing event type", data)
        if kind != "actions":
            INGEST_REQUESTS.labels("ignored").inc()
            return _json(
                202, {"status": "ignored", "reason": f"event type {kind!r} is not ingested"}
            )
        try:
            payload = decode(ActionsPayload, body)
        except InvalidMessage as exc:
            return await dead_letter(body, exc.reason, data)

        try:
            async with asyncio.timeout(produce_timeout_s):
                # The original bytes, not a re-serialisation: fields we do not
                # model yet still reach the consumers.
                meta = await producer.add_raw(payload.session_id, body)
        except Exception as exc:
            log.error("ingest: produce failed (%s): %s", type(exc).__name__, exc)
            return _reject(503, "unavailable", "Kafka did not acknowledge the payload; retry")
        INGEST_REQUESTS.labels("accepted").inc()
        answer: dict[str, Any] = {"status": "accepted", "actions": len(payload.actions)}
        if meta is not None and hasattr(meta, "partition"):
            answer.update(partition=meta.partition, offset=meta.offset)
        return _json(202, answer)

    async def healthz(_: web.Request) -> web.Response:
        connected = getattr(producer, "connected", None)
        return _json(200, {"status": "ok", "kafka_connected": connected})

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


def conversation_link(data: Any, attribute: str) -> tuple[str, str] | None:
    """(session, conversation) from an Intercom notification, or None when it names no
    session; raises ``InvalidMessage`` for a conversation notification that is malformed."""
    if not isinstance(data, dict):
        raise InvalidMessage(f"not a JSON object: {type(data).__name__}")
    topic = data.get("topic")
    if not isinstance(topic, str) or not topic.startswith("conversation."):
        return None  # e.g. "ping", sent when the webhook is set up
    body = data.get("data")
    item = body.get("item") if isinstance(body, dict) else None
    if not isinstance(item, dict) or item.get("type") != "conversation":
        raise InvalidMessage(f"{topic}: data.item is not a conversation")
    if not isinstance(item.get("id"), str | int) or not str(item["id"]):
        raise InvalidMessage(f"{topic}: the conversation has no id")
    attributes = item.get("custom_attributes")
    session = attributes.get(attribute) if isinstance(attributes, dict) else None
    if not isinstance(session, str) or not session.strip():
        return None
    return session.strip(), str(item["id"])


def intercom_webhook(
    producer: Any, settings: IntercomWebhookSettings, max_body_bytes: int, produce_timeout_s: float
) -> Any:
    """The handler of Intercom's conversation notifications: link the session they name."""
    assert settings.webhook_secret is not None
    secret = settings.webhook_secret.get_secret_value().encode()

    async def handle(request: web.Request) -> web.Response:
        try:
            body = await _read_limited(request, max_body_bytes)
        except _TooLarge:
            return _reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")
        given = request.headers.get(INTERCOM_SIGNATURE_HEADER)
        if not signing.verify(secret, body, given, "sha1"):
            return _reject(401, "unauthorized", f"missing or invalid {INTERCOM_SIGNATURE_HEADER}")
        try:
            found = conversation_link(orjson.loads(body), settings.session_attribute)
        except orjson.JSONDecodeError as exc:
            return _reject(422, "invalid", f"not valid JSON: {exc}")
        except InvalidMessage as exc:
            return _reject(422, "invalid", exc.reason)
        if found is None:
            INGEST_REQUESTS.labels("ignored").inc()
            return _json(200, {"status": "ignored", "reason": "no session to link"})
        session_id, conversation_id = found
        try:
            async with asyncio.timeout(produce_timeout_s):
                meta = await producer.link(session_id, conversation_id)
        except InvalidMessage as exc:
            return _reject(422, "invalid", exc.reason)
        except Exception as exc:
            log.error("ingest: link not produced (%s): %s", type(exc).__name__, exc)
            return _reject(503, "unavailable", "Kafka did not acknowledge the link; retry")
        INGEST_REQUESTS.labels("linked").inc()
        answer: dict[str, Any] = {"status": "linked", "session_id": session_id}
        answer.update(conversation_id=conversation_id, partition=meta.partition, offset=meta.offset)
        return _json(202, answer)

    return handle


def _load_ingest_settings() -> IngestSettings:
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


@stop_on_configuration_error()
def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = load_settings()
    ingest = _load_ingest_settings()

    async def build() -> web.Application:
        try:
            await ensure_topics(settings)
        except Exception as exc:  # the producer reconnects; requests get 503 until then
            log.warning("ingest: could not ensure topics (%s)", exc)
        return ingest_app_from_settings(settings, ingest)

    log.info("ingest: listening on http://%s:%d", ingest.host, ingest.port)
    web.run_app(build(), host=ingest.host, port=ingest.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
