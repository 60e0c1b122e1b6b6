"""``POST /intercom``: Intercom's conversation webhooks -> session links.

Signed ``X-Hub-Signature: sha1=<hex HMAC-SHA1>`` with the app's client secret
(``AC_INTERCOM_WEBHOOK_SECRET``): a conversation that names a session in its
custom attribute ``AC_INTERCOM_SESSION_ATTRIBUTE`` links that session to it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from aiohttp import web
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from agents.ingest.bodies import INGEST_REQUESTS, BodyTooLarge, json_response, read_limited, reject
from schemas import InvalidMessage
from schemas.connector import INTERCOM_SIGNATURE_HEADER, verify

__all__ = ["IntercomWebhookSettings", "conversation_link", "intercom_webhook"]

log = logging.getLogger(__name__)


class IntercomWebhookSettings(BaseSettings):
    """``AC_INTERCOM_WEBHOOK_SECRET`` (the Intercom app's client secret) turns the route on."""

    model_config = SettingsConfigDict(env_prefix="AC_INTERCOM_", extra="ignore")

    webhook_secret: SecretStr | None = None
    session_attribute: str = Field(default="session_id", min_length=1)


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
            body = await read_limited(request, max_body_bytes)
        except BodyTooLarge:
            return reject(413, "too_large", f"body exceeds {max_body_bytes} bytes")
        given = request.headers.get(INTERCOM_SIGNATURE_HEADER)
        if not verify(secret, body, given, "sha1"):
            return reject(401, "unauthorized", f"missing or invalid {INTERCOM_SIGNATURE_HEADER}")
        try:
            found = conversation_link(orjson.loads(body), settings.session_attribute)
        except orjson.JSONDecodeError as exc:
            return reject(422, "invalid", f"not valid JSON: {exc}")
        except InvalidMessage as exc:
            return reject(422, "invalid", exc.reason)
        if found is None:
            INGEST_REQUESTS.labels("ignored").inc()
            return json_response(200, {"status": "ignored", "reason": "no session to link"})
        session_id, conversation_id = found
        try:
            async with asyncio.timeout(produce_timeout_s):
                meta = await producer.link(session_id, conversation_id)
        except InvalidMessage as exc:
            return reject(422, "invalid", exc.reason)
        except Exception as exc:
            log.error("ingest: link not produced (%s): %s", type(exc).__name__, exc)
            return reject(503, "unavailable", "Kafka did not acknowledge the link; retry")
        INGEST_REQUESTS.labels("linked").inc()
        answer: dict[str, Any] = {"status": "linked", "session_id": session_id}
        answer.update(conversation_id=conversation_id, partition=meta.partition, offset=meta.offset)
        return json_response(202, answer)

    return handle
