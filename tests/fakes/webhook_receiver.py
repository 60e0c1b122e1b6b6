"""A loopback webhook receiver that checks signatures and dedupes by Idempotency-Key.

It verifies ``X-Connector-Signature`` over the raw body bytes (401 when
wrong), keeps the first delivery of each ``Idempotency-Key`` and counts the
rest as duplicates (answered 200, as a well-behaved receiver does). Failures
are programmable per request:

- ``"500"``, ``"503"``, ``"400"``...: answered with that status, nothing kept;
- ``"429"``: with ``Retry-After``;
- ``"accept-then-500"``: the delivery is kept, then 500 is answered, so the
  sender must deliver it again (a real redelivery, with the same key);
- ``"timeout"``: held longer than the sender waits.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from tests.fakes.loopback import LoopbackServer

__all__ = ["Delivery", "WebhookReceiver"]


@dataclass
class Delivery:
    key: str | None
    body: dict[str, Any]
    raw: bytes
    signature_ok: bool
    arrived: float  # time.monotonic()
    mode: str = "ok"
    status: int | None = None
    duplicate: bool = False


class WebhookReceiver(LoopbackServer):
    def __init__(
        self, secret: str, *, retry_after_s: float = 0.5, timeout_hold_s: float = 30.0
    ) -> None:
        super().__init__()
        self.secret = secret
        self.retry_after_s = retry_after_s
        self.timeout_hold_s = timeout_hold_s
        self.deliveries: list[Delivery] = []  # every request, in arrival order
        self.accepted: dict[str, Delivery] = {}  # first delivery per key, insertion-ordered
        self._plan: deque[str] = deque()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/hook", self._handle)

    @property
    def url(self) -> str:
        return f"{self.origin}/hook"

    def fail(self, *modes: str) -> None:
        self._plan.extend(modes)

    def verify(self, raw: bytes, header: str | None) -> bool:
        if not header or not header.startswith("sha256="):
            return False
        expected = hmac.new(self.secret.encode(), raw, hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, header.removeprefix("sha256="))

    @property
    def duplicates(self) -> list[Delivery]:
        return [d for d in self.deliveries if d.duplicate]

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            body = {}
        delivery = Delivery(
            key=request.headers.get("Idempotency-Key"),
            body=body if isinstance(body, dict) else {},
            raw=raw,
            signature_ok=self.verify(raw, request.headers.get("X-Connector-Signature")),
            arrived=time.monotonic(),
        )
        self.deliveries.append(delivery)
        response = await self._respond(delivery)
        delivery.status = response.status
        return response

    async def _respond(self, delivery: Delivery) -> web.Response:
        if not delivery.signature_ok:
            return web.json_response({"error": "invalid signature"}, status=401)
        if not delivery.key:
            return web.json_response({"error": "Idempotency-Key required"}, status=400)
        mode = delivery.mode = self._plan.popleft() if self._plan else "ok"
        if mode == "timeout":
            try:
                async with asyncio.timeout(self.timeout_hold_s):
                    await self._closing.wait()
            except TimeoutError:
                pass
            return web.json_response({"error": "timeout"}, status=504)
        if mode == "429":
            return web.json_response(
                {"error": "slow down"},
                status=429,
                headers={"Retry-After": f"{self.retry_after_s:g}"},
            )
        if mode.isdigit():
            return web.json_response({"error": f"fake {mode}"}, status=int(mode))
        if delivery.key in self.accepted:
            delivery.duplicate = True
            return web.json_response({"ok": True, "duplicate": True})
        self.accepted[delivery.key] = delivery
        if mode == "accept-then-500":
            return web.json_response({"error": "kept it, then failed"}, status=500)
        return web.json_response({"ok": True})
