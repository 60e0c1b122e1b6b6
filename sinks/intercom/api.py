"""The three Intercom API calls the sink needs, with Intercom's status codes interpreted."""

from __future__ import annotations

import logging
from collections.abc import Generator
from typing import Any

import httpx
from pydantic import SecretStr

from sinks._http import Destination, TransientHTTPError
from sinks.base import PermanentSinkError
from sinks.intercom.settings import IntercomSettings
from streams.errors import AgentContextError

__all__ = ["ConversationMissing", "ConversationNotFound", "IntercomAPI"]

log = logging.getLogger(__name__)


class ConversationNotFound(AgentContextError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"Intercom conversation {conversation_id} not found")
        self.conversation_id = conversation_id


class ConversationMissing(PermanentSinkError):
    """Refused because the conversation is still not there after the grace period."""


class _BearerAuth(httpx.Auth):
    """Adds the token per request, so it is in no client default, repr or error text."""

    def __init__(self, token: SecretStr) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        yield request

    def __repr__(self) -> str:
        return "<BearerAuth ***>"


class IntercomAPI:
    """The three calls the sink needs, with Intercom's status codes interpreted."""

    def __init__(
        self, settings: IntercomSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self.http = Destination(
            label="Intercom",
            timeout_s=settings.timeout_s,
            max_concurrency=settings.max_concurrency,
            attempts=settings.attempts,
            secrets=(settings.token.get_secret_value(),),
            headers={"Accept": "application/json", "Intercom-Version": settings.version},
            transport=transport,
            base_url=settings.api_base.rstrip("/"),
            auth=_BearerAuth(settings.token),
        )

    def __repr__(self) -> str:
        return f"<IntercomAPI {self.settings.api_base} admin={self.settings.admin_id}>"

    async def aclose(self) -> None:
        await self.http.aclose()

    def _unexpected(self, method: str, path: str, response: httpx.Response) -> Exception:
        text = self.http.error(method, path, response)
        if response.status_code == 401:
            # A revoked or wrong token is an outage to fix, not a verdict on this
            # operation: keep it (the lane waits, retried with backoff) and say so.
            log.error("%s: check AC_INTERCOM_TOKEN", text)
            return TransientHTTPError(text, status=401)
        return PermanentSinkError(text)

    async def reply_note(self, conversation_id: str, body: str) -> list[dict[str, Any]]:
        """Post an admin note; returns the conversation's parts (the new one is last)."""
        path = f"/conversations/{conversation_id}/reply"
        payload = {
            "message_type": "note",
            "type": "admin",
            "admin_id": self.settings.admin_id,
            "body": body,
        }
        response = await self.http.send("POST", path, idempotent=False, json=payload)
        if response.status_code == 404:
            raise ConversationNotFound(conversation_id)
        if not response.is_success:
            raise self._unexpected("POST", path, response)
        return _parts(response)

    async def redact(self, conversation_id: str, part_id: str) -> bool:
        """Redact a part; True when done (including already redacted or gone)."""
        path = "/conversations/redact"
        payload = {
            "type": "conversation_part",
            "conversation_id": conversation_id,
            "conversation_part_id": part_id,
        }
        response = await self.http.send("POST", path, idempotent=True, json=payload)
        if response.is_success or response.status_code == 404:
            return True
        if response.status_code in (400, 422) and "not_redactable" in response.text:
            return True  # our notes always have a body: this one is redacted already
        error = self._unexpected("POST", path, response)
        if isinstance(error, TransientHTTPError):
            raise error
        log.error("%s: part %s stays visible", error, part_id)
        return False

    async def conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], bool]:
        """The conversation's parts, and whether they are all of them (max 500)."""
        path = f"/conversations/{conversation_id}"
        response = await self.http.send("GET", path, idempotent=True)
        if response.status_code == 404:
            raise ConversationNotFound(conversation_id)
        if not response.is_success:
            raise self._unexpected("GET", path, response)
        parts = _parts(response)
        try:
            total = int(response.json()["conversation_parts"].get("total_count", len(parts)))
        except (KeyError, TypeError, ValueError, AttributeError):
            total = len(parts)
        return parts, total <= len(parts)


def _parts(response: httpx.Response) -> list[dict[str, Any]]:
    try:
        parts = response.json()["conversation_parts"]["conversation_parts"]
    except (KeyError, TypeError, ValueError):
        return []
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []
