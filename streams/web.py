"""HTTP endpoints every worker serves on its Faust web server."""

from __future__ import annotations

import faust
from faust.web import Request, Response, View
from prometheus_client import generate_latest

from streams.lag import worker_status

__all__ = ["add_operational_pages"]


def add_operational_pages(app: faust.App) -> None:
    @app.page("/metrics")
    async def metrics(web: View, request: Request) -> Response:
        # Prometheus text exposition format 0.0.4 (aiohttp refuses a charset here).
        return web.text(generate_latest().decode(), content_type="text/plain")

    @app.page("/healthz")
    async def healthz(web: View, request: Request) -> Response:
        status = worker_status(app)  # 503 while starting, rebalancing, recovering, stopping
        return web.json(
            {"status": "ok" if status["ready"] else "unavailable", **status},
            status=200 if status["ready"] else 503,
        )
