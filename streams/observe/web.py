"""HTTP endpoints every worker serves on its Faust web server."""

from __future__ import annotations

import hmac

import faust
from faust.web import Request, Response, View
from prometheus_client import generate_latest
from pydantic import SecretStr

from streams.observe.lag import worker_status
from streams.settings import Settings

__all__ = ["add_operational_pages", "browser_cookie", "unauthorized", "unauthorized_browser"]

COOKIE = "ac_view"  # the browser's proof of the token (never the token itself)


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


def browser_cookie(token: SecretStr) -> str:
    """The cookie value a browser gets for the token: an HMAC of it, so the cookie
    jar never holds the token (and changing the token logs every browser out)."""
    key = token.get_secret_value().encode()
    return hmac.new(key, b"agent-context-view", "sha256").hexdigest()


def unauthorized_browser(web: View, request: Request, token: SecretStr | None) -> Response | None:
    """:func:`unauthorized` for pages a browser opens: the bearer header, or the
    HttpOnly cookie that ``?token=<AC_API_TOKEN>`` sets once (see sinks/view)."""
    if token is None or unauthorized(web, request, token) is None:
        return None
    given = request.cookies.get(COOKIE, "")
    if given and hmac.compare_digest(given.encode(), browser_cookie(token).encode()):
        return None
    return web.html(
        "<!doctype html><title>401</title><p>Unauthorized: open this page once with "
        "<code>?token=&lt;AC_API_TOKEN&gt;</code>, or send "
        "<code>Authorization: Bearer &lt;AC_API_TOKEN&gt;</code>.</p>",
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
