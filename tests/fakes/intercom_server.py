"""A real HTTP server on 127.0.0.1 that speaks the slice of the Intercom REST API the sink uses.

- ``POST /conversations/{id}/reply``: an admin note; answers the conversation
  object with its parts, the new one last (as Intercom does);
- ``POST /conversations/redact``: redacts a part (``redacted: true``, body
  blanked); a part already redacted answers 400 ``conversation_part_not_redactable``,
  a missing one 404;
- ``GET /conversations/{id}``: the conversation with its parts.

Every request must carry ``Authorization: Bearer <token>`` (401 otherwise) and
``Intercom-Version`` (400 otherwise). Failures are programmable: a queue of
modes for the next requests (``fail``), a random rate-limit storm
(``storm``), or a mode for a while (``fail_for``). Every call is recorded in
arrival order with its times, so tests can check ordering at the destination.

    async with FakeIntercomServer(token="tok") as intercom:
        intercom.add_conversation("c1")
        intercom.storm(0.3, reset_s=1)     # 30% of calls answer 429
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = ["Call", "FakeIntercomServer", "Part"]

# "500-after" applies the request, then answers 500: the client can't know it worked.
# Any other HTTP error status ("400", "404", "503", ...) is answered as such.
MODES = ("ok", "429", "500-after", "timeout")


@dataclass
class Part:
    id: str
    conversation_id: str
    body: str
    admin_id: str
    created_at: float  # time.time()
    part_type: str = "note"
    redacted: bool = False
    redacted_at: float | None = None
    original_body: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "conversation_part",
            "id": self.id,
            "part_type": self.part_type,
            "body": "" if self.redacted else self.body,
            "created_at": int(self.created_at),
            "updated_at": int(self.redacted_at or self.created_at),
            "notified_at": int(self.created_at),
            "assigned_to": None,
            "author": {
                "id": self.admin_id,
                "type": "admin",
                "name": "Context Bot",
                "email": "bot@example.com",
            },
            "attachments": [],
            "external_id": None,
            "redacted": self.redacted,
        }


@dataclass
class Call:
    method: str
    path: str
    kind: str  # reply | redact | get | other
    arrived: float  # time.monotonic()
    conversation_id: str | None = None
    part_id: str | None = None  # created (reply) or targeted (redact)
    mode: str = "ok"
    status: int | None = None
    completed: float | None = None  # time.monotonic() when answered
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class Conversation:
    id: str
    created_at: float
    parts: list[Part] = field(default_factory=list)


class FakeIntercomServer(LoopbackServer):
    def __init__(
        self,
        *,
        token: str = "test-intercom-token",
        version: str = "2.11",
        auto_create: bool = False,
        timeout_hold_s: float = 30.0,
        max_parts: int = 500,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.token = token
        self.version = version
        self.auto_create = auto_create
        self.timeout_hold_s = timeout_hold_s
        self.max_parts = max_parts
        self.conversations: dict[str, Conversation] = {}
        self.parts: dict[str, Part] = {}
        self.calls: list[Call] = []
        self._ids = itertools.count(1000)
        self._plan: deque[str] = deque()
        self._mode: str | None = None
        self._mode_until: float | None = None
        self._storm: tuple[float, float, float | None, bool] | None = None
        self._random = random.Random(seed)

    # -- lifecycle ---------------------------------------------------------

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/conversations/redact", self._redact)
        app.router.add_post("/conversations/{id}/reply", self._reply)
        app.router.add_get("/conversations/{id}", self._get)

    @property
    def url(self) -> str:
        return self.origin

    # -- programming ----------------------------------------------------------

    def add_conversation(self, conversation_id: str) -> None:
        self.conversations.setdefault(
            conversation_id, Conversation(id=conversation_id, created_at=time.time())
        )

    def fail(self, *modes: str) -> None:
        """The next requests get these modes, in order."""
        for mode in modes:
            self._check(mode)
        self._plan.extend(modes)

    def fail_for(self, mode: str, seconds: float | None) -> None:
        """Every request gets ``mode`` for ``seconds`` (None: until ``recover``)."""
        self._check(mode)
        self._mode = mode
        self._mode_until = None if seconds is None else time.monotonic() + seconds

    def storm(
        self,
        fraction: float,
        *,
        reset_s: float = 1.0,
        seconds: float | None = None,
        retry_after: bool = False,
    ) -> None:
        """A share of requests answer 429 (``X-RateLimit-Reset``, or ``Retry-After``)."""
        until = None if seconds is None else time.monotonic() + seconds
        self._storm = (fraction, reset_s, until, retry_after)

    def recover(self) -> None:
        self._plan.clear()
        self._mode = self._mode_until = None
        self._storm = None

    @staticmethod
    def _check(mode: str) -> None:
        if mode not in MODES and not (mode.isdigit() and 400 <= int(mode) <= 599):
            raise ValueError(f"unknown mode {mode!r}")

    def _next_mode(self) -> str:
        if self._plan:
            return self._plan.popleft()
        if self._mode is not None:
            if self._mode_until is None or time.monotonic() < self._mode_until:
                return self._mode
            self._mode = self._mode_until = None
        if self._storm is not None:
            fraction, _, until, _ = self._storm
            if until is not None and time.monotonic() >= until:
                self._storm = None
            elif self._random.random() < fraction:
                return "429"
        return "ok"

    # -- observations -----------------------------------------------------------

    def notes(self, conversation_id: str) -> list[Part]:
        """Every note ever posted to the conversation, in order (redacted ones included)."""
        conversation = self.conversations.get(conversation_id)
        return [p for p in conversation.parts if p.part_type == "note"] if conversation else []

    def visible_notes(self, conversation_id: str) -> list[Part]:
        return [p for p in self.notes(conversation_id) if not p.redacted]

    def answered(self, kind: str, status: int = 200) -> list[Call]:
        return [c for c in self.calls if c.kind == kind and c.status == status]

    # -- the endpoints ------------------------------------------------------------

    def _error(self, status: int, code: str, message: str, **headers: str) -> web.Response:
        body = {
            "type": "error.list",
            "request_id": f"req-{next(self._ids)}",
            "errors": [{"code": code, "message": message}],
        }
        return web.Response(
            status=status, text=json.dumps(body), content_type="application/json", headers=headers
        )

    async def _gate(self, request: web.Request, call: Call) -> web.Response | None:
        """Authentication, version and the failure plan; None to go on."""
        self.calls.append(call)
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return self._error(401, "unauthorized", "Access Token Invalid")
        if not request.headers.get("Intercom-Version"):
            return self._error(400, "intercom_version_invalid", "Intercom-Version is required")
        if request.headers.get("Intercom-Version") != self.version:
            return self._error(400, "intercom_version_invalid", "unexpected Intercom-Version")
        call.mode = self._next_mode()
        if call.mode == "429":
            reset_s = self._storm[1] if self._storm else 1.0
            retry_after = self._storm[3] if self._storm else False
            headers = {"X-RateLimit-Limit": "1000", "X-RateLimit-Remaining": "0"}
            if retry_after:
                headers["Retry-After"] = f"{reset_s:g}"
            else:
                headers["X-RateLimit-Reset"] = str(int(time.time() + reset_s))
            return self._error(429, "rate_limit_exceeded", "Too many requests", **headers)
        if call.mode.isdigit():
            status = int(call.mode)
            code = "server_error" if status >= 500 else "parameter_invalid"
            return self._error(status, code, f"fake failure {status}")
        if call.mode == "timeout":
            try:
                async with asyncio.timeout(self.timeout_hold_s):
                    await self._closing.wait()
            except TimeoutError:
                pass
            return self._error(504, "gateway_timeout", "fake timeout")
        return None

    def _finish(self, call: Call, response: web.Response) -> web.Response:
        if call.mode == "500-after" and response.status < 300:
            response = self._error(500, "server_error", "applied, then failed")
        call.status = response.status
        call.completed = time.monotonic()
        return response

    def _conversation_json(self, conversation: Conversation) -> dict[str, Any]:
        parts = conversation.parts[-self.max_parts :]
        return {
            "type": "conversation",
            "id": conversation.id,
            "created_at": int(conversation.created_at),
            "updated_at": int(time.time()),
            "waiting_since": None,
            "snoozed_until": None,
            "source": {
                "type": "conversation",
                "id": f"src-{conversation.id}",
                "delivered_as": "customer_initiated",
                "subject": "",
                "body": "<p>Help!</p>",
                "author": {"type": "user", "id": "u1"},
                "attachments": [],
                "url": None,
                "redacted": False,
            },
            "contacts": {"type": "contact.list", "contacts": []},
            "admin_assignee_id": None,
            "team_assignee_id": None,
            "open": True,
            "state": "open",
            "read": True,
            "tags": {"type": "tag.list", "tags": []},
            "priority": "not_priority",
            "custom_attributes": {},
            "conversation_parts": {
                "type": "conversation_part.list",
                "conversation_parts": [p.to_json() for p in parts],
                "total_count": len(conversation.parts),
            },
        }

    def _lookup(self, conversation_id: str) -> Conversation | None:
        if conversation_id not in self.conversations and self.auto_create:
            self.add_conversation(conversation_id)
        return self.conversations.get(conversation_id)

    async def _reply(self, request: web.Request) -> web.Response:
        conversation_id = request.match_info["id"]
        call = Call("POST", request.path, "reply", time.monotonic(), conversation_id)
        try:
            call.body = await request.json()
        except ValueError:
            call.body = {}
        if (early := await self._gate(request, call)) is not None:
            return self._finish(call, early)
        conversation = self._lookup(conversation_id)
        if conversation is None:
            return self._finish(call, self._error(404, "not_found", "Resource Not Found"))
        body = call.body
        if (
            body.get("message_type") != "note"
            or body.get("type") != "admin"
            or not body.get("admin_id")
            or not isinstance(body.get("body"), str)
            or not body["body"].strip()
        ):
            return self._finish(call, self._error(400, "parameter_invalid", "bad note"))
        part = Part(
            id=str(next(self._ids)),
            conversation_id=conversation_id,
            body=body["body"],
            admin_id=str(body["admin_id"]),
            created_at=time.time(),
            original_body=body["body"],
        )
        conversation.parts.append(part)
        self.parts[part.id] = part
        call.part_id = part.id
        return self._finish(call, web.json_response(self._conversation_json(conversation)))

    async def _redact(self, request: web.Request) -> web.Response:
        call = Call("POST", request.path, "redact", time.monotonic())
        try:
            call.body = await request.json()
        except ValueError:
            call.body = {}
        call.conversation_id = str(call.body.get("conversation_id"))
        call.part_id = str(call.body.get("conversation_part_id"))
        if (early := await self._gate(request, call)) is not None:
            return self._finish(call, early)
        if call.body.get("type") != "conversation_part":
            return self._finish(call, self._error(400, "parameter_invalid", "bad type"))
        conversation = self.conversations.get(call.conversation_id)
        part = self.parts.get(call.part_id)
        if conversation is None or part is None or part.conversation_id != conversation.id:
            return self._finish(call, self._error(404, "not_found", "Resource Not Found"))
        if part.redacted:
            return self._finish(
                call,
                self._error(400, "conversation_part_not_redactable", "Part can't be redacted"),
            )
        part.redacted, part.redacted_at = True, time.time()
        return self._finish(call, web.json_response(self._conversation_json(conversation)))

    async def _get(self, request: web.Request) -> web.Response:
        conversation_id = request.match_info["id"]
        call = Call("GET", request.path, "get", time.monotonic(), conversation_id)
        if (early := await self._gate(request, call)) is not None:
            return self._finish(call, early)
        conversation = self._lookup(conversation_id)
        if conversation is None:
            return self._finish(call, self._error(404, "not_found", "Resource Not Found"))
        return self._finish(call, web.json_response(self._conversation_json(conversation)))
