"""Webhook sink: every context operation POSTed as signed JSON to one URL.

``AC_SINK=webhook``, ``AC_WEBHOOK_URL``, ``AC_WEBHOOK_SECRET``. Each request:

- body: ``{"type": <op>, "idempotency_key": ..., "operation": <the op>,
  "context": {"summary", "summary_to", "actions_to", "text"}}`` (``context`` is
  what an agent should read now, after this operation; ``AC_WEBHOOK_INCLUDE_CONTEXT=false``
  leaves it out);
- ``X-Connector-Signature: sha256=<hex>``: HMAC-SHA256 of the exact body bytes
  with the secret, the header the SDK's ``WebhookReceiver`` verifies;
- ``Idempotency-Key``: derived from the operation alone (session, generation,
  op type, sequence range), so a redelivery (a retry, a replay after a crash)
  carries the same key and the receiver can drop it (the SDK sends no key).

Answers: 2xx (and 409, "already have it") done; 429 waits per ``Retry-After`` /
``X-RateLimit-Reset``; 5xx, 408 and timeouts are retried; any other 4xx is a
refusal (:class:`~sinks.base.PermanentSinkError`, dead-lettered). Order per
session holds because the lane waits until the receiver took the operation.
"""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import orjson
from pydantic import AnyHttpUrl, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.connector import SIGNATURE_HEADER, sign
from sinks._http import Destination, NonBlankSecret
from sinks.base import Operation, PermanentSinkError, Sink
from sinks.context import SessionContext
from streams.settings import Settings, from_environment

__all__ = ["WebhookSettings", "WebhookSink", "idempotency_key"]


class WebhookSettings(BaseSettings):
    """``AC_WEBHOOK_*``: read only when the webhook sink is used."""

    model_config = SettingsConfigDict(env_prefix="AC_WEBHOOK_", extra="ignore")

    url: AnyHttpUrl
    secret: NonBlankSecret  # the SDK's receiver accepts everything when its secret is empty
    timeout_s: float = Field(default=10.0, gt=0)
    attempts: int = Field(default=4, ge=1)
    max_concurrency: int = Field(default=16, ge=1)
    include_context: bool = True

    @classmethod
    def load(cls) -> WebhookSettings:
        return from_environment(cls, "AC_WEBHOOK_")


def idempotency_key(op: Operation) -> str:
    """Stable for the same operation however often it is delivered; unique per operation."""
    identity = orjson.dumps([op.session_id, op.generation, op.op, op.seq_from, op.seq_to])
    return hashlib.sha256(identity).hexdigest()


class WebhookSink(Sink):
    name = "webhook"

    def __init__(
        self, settings: WebhookSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self._secret = settings.secret.get_secret_value()
        # 409 is not retried here: receivers use it for "I have this Idempotency-Key already".
        self.http = Destination(
            label="webhook",
            timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency,
            attempts=settings.attempts,
            secrets=(self._secret,),
            retry_statuses=frozenset({408, 425}),
            transport=transport,
        )

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookSink:
        return cls(WebhookSettings.load())

    def __repr__(self) -> str:
        return f"<WebhookSink {self.settings.url}>"

    def body(self, op: Operation, context: SessionContext) -> dict[str, Any]:
        key = idempotency_key(op)
        body: dict[str, Any] = {
            "type": op.op,
            "idempotency_key": key,
            "operation": op.model_dump(mode="json"),
        }
        if self.settings.include_context:
            body["context"] = {
                "summary": context.summary,
                "summary_to": context.summary_to,
                "actions_to": context.actions_to,
                "text": context.render(),
            }
        return body

    async def apply(self, op: Operation, context: SessionContext) -> None:
        await self._post(self.body(op, context), idempotency_key(op))

    async def erase(self, session_id: str, context: SessionContext) -> None:
        """Tell the receiver to delete what it holds of the session (``session_erased``)."""
        identity = orjson.dumps(["session_erased", session_id, context.generation])
        key = hashlib.sha256(identity).hexdigest()
        body: dict[str, Any] = {"type": "session_erased", "idempotency_key": key}
        body["operation"] = {"op": "session_erased", "session_id": session_id}
        await self._post(body, key)

    async def _post(self, body: dict[str, Any], key: str) -> None:
        raw = orjson.dumps(body)
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(self._secret, raw),
            "Idempotency-Key": key,
        }
        url = str(self.settings.url)
        # Safe to repeat: the receiver drops a second delivery by its key.
        response = await self.http.send("POST", url, idempotent=True, content=raw, headers=headers)
        if response.is_success or response.status_code == 409:
            return
        raise PermanentSinkError(self.http.error("POST", url, response))

    async def aclose(self) -> None:
        await self.http.aclose()
