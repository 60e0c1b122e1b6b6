"""HTTP endpoints every worker serves on its Faust web server."""

from __future__ import annotations

import hmac

import faust
from faust.web import Request, Response, View
from prometheus_client import generate_latest
from pydantic import SecretStr

from streams.lag import worker_status
from streams.settings import Settings

__all__ = ["add_operational_pages", "unauthorized"]


def unauthorized(web: View, request: Request, token: SecretStr | None) -> Response | None:
    """A 401 answer unless ``request`` carries ``Authorization: Bearer <token>`` (compared
    in constant time); None when it does, or when no token is configured."""
    if token is None:
        return None
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    expected = token.get_secret_value().encode()
    if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), expected):
        return None
    return web.json(
        {"error": "unauthorized: send Authorization: Bearer <AC_API_TOKEN>"},
        status=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def add_operational_pages(app: faust.App, settings: Settings) -> None:
    metrics_token = settings.api_token if settings.metrics_require_token else None

    @app.page("/metrics")
    async def metrics(web: View, request: Request) -> Response:
        if (refused := unauthorized(web, request, metrics_token)) is not None:
            return refused
        # Prometheus text exposition format 0.0.4 (aiohttp refuses a charset here).
        return web.text(generate_latest().decode(), content_type="text/plain")

    @app.page("/healthz")
    async def healthz(web: View, request: Request) -> Response:
        status = worker_status(app)  # 503 while starting, rebalancing, recovering, stopping
        return web.json(
            {"status": "ok" if status["ready"] else "unavailable", **status},
            status=200 if status["ready"] else 503,
        )
