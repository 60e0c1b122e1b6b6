"""What the ingest routes share: bounded body reads, JSON answers, the request counter."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web
from prometheus_client import Counter

from streams.errors import AgentContextError

__all__ = ["INGEST_REQUESTS", "BodyTooLarge", "json_response", "read_limited", "reject"]

INGEST_REQUESTS = Counter("ac_ingest_requests_total", "Webhook ingest requests", ["outcome"])


class BodyTooLarge(AgentContextError):
    pass


def json_response(code: int, body: dict[str, Any]) -> web.Response:
    return web.Response(status=code, body=orjson.dumps(body), content_type="application/json")


def reject(status: int, outcome: str, reason: str) -> web.Response:
    INGEST_REQUESTS.labels(outcome).inc()
    return json_response(status, {"error": reason})


async def read_limited(request: web.Request, limit: int) -> bytes:
    """Read at most ``limit`` bytes: Content-Length can be absent (chunked) or lie."""
    chunks: list[bytes] = []
    size = 0
    while chunk := await request.content.readany():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)
