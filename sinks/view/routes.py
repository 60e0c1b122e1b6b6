"""The session view's endpoints, on the view sink's web port.

``GET /ui/``: the sessions (search, active/closed, server-side pages), live.
``GET /ui/sessions/{id}``: what the agent reads now, the session's timeline (paged:
``?ops=``) and each sink's delivery, live.
``GET /ui/events`` and ``GET /ui/sessions/{id}/events``: their Server-Sent Events,
each event an HTML fragment rendered in sinks/view/render.py with every value escaped.
``GET /ui/app.js``: the page's only script (no session data in it).

Access is the pull view's (README "Access"): ``Authorization: Bearer`` or, for a
browser, the HttpOnly cookie that opening any page once with ``?token=`` sets.
"""

from __future__ import annotations

import asyncio
import hmac
import time
from collections.abc import Awaitable, Callable
from html import escape
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from aiohttp import web as aio
from faust.web import Request, Response, View
from pydantic import SecretStr

from sinks.context import SessionContext
from sinks.view.delivery import delivery, delivery_fragment
from sinks.view.operators import operator_strip
from sinks.view.render import (
    CSP,
    SCRIPT,
    STATUSES,
    html_page,
    list_body,
    list_fragment,
    session_fragment,
    session_url,
)
from sinks.view.sink import row_from
from streams.observe.web import COOKIE, browser_cookie, unauthorized_browser

if TYPE_CHECKING:
    from sinks.view.sink import ViewSink

__all__ = ["add_routes"]

KEEPALIVE_S = 15.0
LIST_MIN_INTERVAL_S = 0.5  # a busy stream re-renders a list page at most this often
DELIVERY_EVERY_S = 2.0  # other sinks' progress wakes nothing here: their state is polled


def _number(request: Request, name: str) -> int:
    try:
        return max(1, int(request.query.get(name, "1")))
    except ValueError:
        return 1


def _list_params(request: Request) -> tuple[str, str, int]:
    query = request.query.get("q", "").strip()[:200]
    status = request.query.get("status", "all")
    return query, status if status in STATUSES else "all", _number(request, "page")


def _sse(event: str, data: str) -> bytes:
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {event}\n{lines}\n".encode()


async def _stream(
    request: Request, sink: ViewSink, version: Callable[[], int], render: Callable[[], str],
    min_interval: float = 0.0, polled: Callable[[], Awaitable[str]] | None = None,
) -> aio.StreamResponse:  # fmt: skip
    """``update`` events when ``version()`` changes; with ``polled``, a ``delivery``
    event whenever its HTML changes (asked at most every DELIVERY_EVERY_S)."""
    response = aio.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)  # type: ignore[arg-type]
    sent, polled_html, polled_at = -1, "", 0.0
    try:
        while True:
            change = sink.next_change()
            if (now := version()) != sent:
                sent = now
                await response.write(_sse("update", render()))
                if min_interval:
                    await asyncio.sleep(min_interval)  # rate limit, not synchronisation
                    continue
            elif polled is None:
                await response.write(b": keep-alive\n\n")
            if polled is not None and time.monotonic() - polled_at >= DELIVERY_EVERY_S:
                polled_at = time.monotonic()
                if (html := await polled()) != polled_html:
                    polled_html = html
                    await response.write(_sse("delivery", html))
                else:
                    await response.write(b": keep-alive\n\n")
            await sink.wait(change, DELIVERY_EVERY_S if polled is not None else KEEPALIVE_S)
    except (ConnectionResetError, RuntimeError):  # the browser went away
        pass
    return response


def _html(web: View, body: str, status: int = 200) -> Response:
    return web.html(
        body,
        status=status,
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store",
                 "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"},
    )  # fmt: skip


def _token_login(web: View, request: Request, token: SecretStr | None) -> Response | None:
    """``?token=<AC_API_TOKEN>`` once: an HttpOnly cookie, and the same URL without it."""
    given = request.query.get("token")
    if given is None:
        return None
    if token is not None and not hmac.compare_digest(
        given.encode(), token.get_secret_value().encode()
    ):
        return None  # the access check that follows refuses it
    rest = urlencode([(k, v) for k, v in request.query.items() if k != "token"])
    headers = {
        "Location": request.url.path + (f"?{rest}" if rest else ""),
        "Cache-Control": "no-store",
    }
    if token is not None:
        headers["Set-Cookie"] = (
            f"{COOKIE}={browser_cookie(token)}; HttpOnly; SameSite=Strict; Path=/ui"
        )
    return web.html("", status=303, headers=headers)


def add_routes(
    app: Any, contexts: Any, load: Callable[[str], SessionContext], sink: ViewSink
) -> None:
    token = app.settings.api_token  # the pull view's access control (README "Access")
    secret = token.get_secret_value() if token else None
    others = sink.settings.metrics_url_list

    def context_of(session_id: str) -> SessionContext | None:
        return load(session_id) if contexts.get(session_id) is not None else None

    def ensure_indexed() -> None:
        """After a restart or a rebalance the rows come back from the table (the
        contexts it restored), once per consumer group generation."""
        generation = app.consumer_generation_id
        if sink.indexed == generation:
            return
        sink.indexed = generation
        for key in list(contexts.keys()):
            if "\x1f" not in key and key not in sink.rows:  # a header, not a batch
                sink.index(row_from(load(key)))

    async def delivered(session_id: str) -> str:
        found = await delivery(others, secret, session_id) if others else []
        return delivery_fragment(found, context_of(session_id))

    def refuse(web: View, request: Request) -> Response | None:
        return _token_login(web, request, token) or unauthorized_browser(web, request, token)

    @app.page("/ui")
    async def ui_root(web: View, request: Request) -> Response:
        return web.html("", status=301, headers={"Location": "/ui/"})

    @app.page("/ui/app.js")
    async def script(web: View, request: Request) -> Response:
        return web.text(SCRIPT, content_type="text/javascript")

    @app.page("/ui/")
    async def sessions(web: View, request: Request) -> Response:
        if (refused := refuse(web, request)) is not None:
            return refused
        ensure_indexed()
        query, status, page = _list_params(request)
        strip = await operator_strip(others, secret)
        return _html(web, html_page("Sessions", "", strip + list_body(sink, query, status, page)))

    @app.page("/ui/events")
    async def sessions_events(web: View, request: Request) -> Any:
        if (refused := refuse(web, request)) is not None:
            return refused
        ensure_indexed()
        query, status, page = _list_params(request)
        return await _stream(
            request, sink, lambda: sink.version,
            lambda: list_fragment(sink, query, status, page), LIST_MIN_INTERVAL_S,
        )  # fmt: skip

    @app.page("/ui/sessions/{session_id}")
    async def session(web: View, request: Request, session_id: str) -> Response:
        if (refused := refuse(web, request)) is not None:
            return refused
        context, ops = context_of(session_id), _number(request, "ops")
        live = f"{session_url(session_id)}/events" + (f"?ops={ops}" if ops > 1 else "")
        body = (
            f'<h1>Session {escape(session_id)}</h1><div id="live" data-live="{escape(live)}">'
            f"{session_fragment(sink, context, session_id, ops)}</div>"
            f'<section><h2>Delivery</h2><div id="delivery">{await delivered(session_id)}'
            "</div></section>"
        )
        page = html_page(f"Session {session_id}", session_id, body)
        return _html(web, page, 200 if context else 404)

    @app.page("/ui/sessions/{session_id}/events")
    async def session_events(web: View, request: Request, session_id: str) -> Any:
        if (refused := refuse(web, request)) is not None:
            return refused
        ops = _number(request, "ops")
        return await _stream(
            request, sink, lambda: sink.versions.get(session_id, 0),
            lambda: session_fragment(sink, context_of(session_id), session_id, ops),
            polled=(lambda: delivered(session_id)) if others else None,
        )  # fmt: skip
