"""The session view's pages, on the view sink's web port.

``GET /ui/``: the sessions (search, active/closed, server-side pages), live.
``GET /ui/sessions/{id}``: what the agent reads now and the session's timeline, live.
``GET /ui/events`` and ``GET /ui/sessions/{id}/events``: their Server-Sent Events,
each event an HTML fragment rendered here with every value escaped.
``GET /ui/app.js``: the page's only script (no session data in it).

Access is the pull view's (README "Access"): ``Authorization: Bearer`` or, for a
browser, the HttpOnly cookie that opening any page once with ``?token=`` sets.
"""

from __future__ import annotations

import asyncio
import hmac
import math
import time
from collections.abc import Callable
from html import escape
from string import Template
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from aiohttp import web as aio
from faust.web import Request, Response, View
from pydantic import SecretStr

from sinks.context import SessionContext, actions_range
from sinks.view.operators import operator_strip
from sinks.view.sink import BOOK, SessionRow, row_from
from streams.observe.web import COOKIE, browser_cookie, unauthorized_browser

if TYPE_CHECKING:
    from sinks.view.sink import ViewSink

__all__ = ["add_routes", "list_page_rows"]

KEEPALIVE_S = 15.0
LIST_MIN_INTERVAL_S = 0.5  # a busy stream re-renders a list page at most this often
STATUSES = ("all", "active", "closed")
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'unsafe-inline'; img-src 'self'; "
    "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)

PAGE = Template("""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>$title</title>
<style>
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:16px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:600}
#live-status{margin-left:auto;font-size:12px;opacity:.8}
main{padding:16px 20px;max-width:1200px}
table{border-collapse:collapse;width:100%;background:#fff}
th,td{text-align:left;padding:6px 8px;border-bottom:1px solid #e3e6ea;vertical-align:top}
th{background:#eef0f3;font-weight:600}
pre{white-space:pre-wrap;word-break:break-word;background:#fff;border:1px solid #e3e6ea;
padding:8px;margin:4px 0 12px}
.pill{display:inline-block;padding:0 6px;border-radius:8px;font-size:12px}
.active{background:#d8f5e0}.closed{background:#e6e6e6}
.summary h3{margin:8px 0 0}.batch h4{margin:6px 0 0;font-weight:600}
form{margin:0 0 12px;display:flex;gap:8px}
.paging{margin:10px 0;display:flex;gap:12px;align-items:center}
.cols{display:grid;grid-template-columns:3fr 2fr;gap:20px}
.meta span{margin-right:14px}
</style></head>
<body><header><a href="/ui/">Sessions</a><span>$heading</span>
<span id="live-status">connecting…</span></header>
<main>$body</main>
<script src="/ui/app.js"></script></body></html>
""")

SCRIPT = """"use strict";
// Live updates: the server sends HTML fragments it rendered with every value
// escaped (sinks/view/routes.py); nothing from the event stream is parsed here.
(function () {
  var live = document.getElementById("live");
  var status = document.getElementById("live-status");
  if (!live || !window.EventSource) { if (status) status.textContent = ""; return; }
  var updates = 0;
  var source = new EventSource(live.getAttribute("data-live"));
  source.addEventListener("update", function (event) {
    live.innerHTML = event.data;
    updates += 1;
    live.setAttribute("data-updates", String(updates));
    status.textContent = "live";
  });
  source.onopen = function () { status.textContent = "live"; };
  source.onerror = function () { status.textContent = "reconnecting…"; };
})();
"""


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + " UTC" if at else "—"


def _session_url(session_id: str) -> str:
    return f"/ui/sessions/{quote(session_id, safe='')}"


def _page(title: str, heading: str, body: str) -> str:
    return PAGE.substitute(title=escape(title), heading=escape(heading), body=body)


def _status(closed: bool) -> str:
    return (
        '<span class="pill closed">closed</span>'
        if closed
        else ('<span class="pill active">active</span>')
    )


# ---------------------------------------------------------------------- the list


def list_page_rows(
    rows: list[SessionRow], query: str, status: str, page: int, size: int
) -> tuple[list[SessionRow], int, int]:
    """One page of the matching sessions, most recently active first: (rows, matching,
    pages). Server-side, so 5,000 or 100,000 sessions cost the browser one page."""
    if query:
        rows = [r for r in rows if r.matches(query)]
    if status != "all":
        rows = [r for r in rows if r.closed == (status == "closed")]
    pages = max(1, math.ceil(len(rows) / size))
    page = min(max(page, 1), pages)
    rows.sort(key=lambda r: r.last_activity, reverse=True)
    return rows[(page - 1) * size : page * size], len(rows), pages


def _list_params(request: Request) -> tuple[str, str, int]:
    query = request.query.get("q", "").strip()[:200]
    status = request.query.get("status", "all")
    status = status if status in STATUSES else "all"
    try:
        page = max(1, int(request.query.get("page", "1")))
    except ValueError:
        page = 1
    return query, status, page


def _list_href(query: str, status: str, page: int, base: str = "/ui/") -> str:
    params = {k: v for k, v in (("q", query), ("status", status), ("page", str(page))) if v}
    if status == "all":
        params.pop("status")
    if page == 1:
        params.pop("page")
    return base + ("?" + urlencode(params) if params else "")


def _list_fragment(sink: ViewSink, query: str, status: str, page: int) -> str:
    size = sink.settings.page_size
    rows, matching, pages = list_page_rows(list(sink.rows.values()), query, status, page, size)
    page = min(page, pages)
    cells = "".join(
        f'<tr data-session="{escape(r.session_id)}">'
        f'<td><a href="{escape(_session_url(r.session_id))}">{escape(r.session_id)}</a></td>'
        f"<td>{escape(r.user_id)}</td><td>{escape(r.email)}</td><td>{escape(r.product_id)}</td>"
        f"<td>{_status(r.closed)}</td><td>{r.actions}</td><td>{r.summaries}</td>"
        f"<td>{escape(_when(r.last_activity))}</td></tr>"
        for r in rows
    )
    prev_link = (
        f'<a rel="prev" href="{escape(_list_href(query, status, page - 1))}">← newer</a>'
        if page > 1
        else ""
    )
    next_link = (
        f'<a rel="next" href="{escape(_list_href(query, status, page + 1))}">older →</a>'
        if page < pages
        else ""
    )
    return (
        f'<div class="paging" data-version="{sink.version}">'
        f'<span id="count">{matching} session{"" if matching == 1 else "s"}, '
        f"page {page} of {pages}</span>{prev_link}{next_link}</div>"
        "<table><thead><tr><th>Session</th><th>User</th><th>Email</th><th>Product</th>"
        "<th>Status</th><th>Actions</th><th>Summaries</th><th>Last activity</th></tr></thead>"
        f'<tbody id="sessions">{cells}</tbody></table>'
    )


def _list_body(sink: ViewSink, query: str, status: str, page: int) -> str:
    options = "".join(
        f'<option value="{s}"{" selected" if s == status else ""}>{s}</option>' for s in STATUSES
    )
    live = _list_href(query, status, page, base="/ui/events")
    return (
        '<form method="get" action="/ui/">'
        f'<input type="search" name="q" value="{escape(query)}" size="40" '
        'placeholder="session, user, email or product">'
        f'<select name="status">{options}</select><button type="submit">Search</button></form>'
        f'<div id="live" data-live="{escape(live)}">'
        f"{_list_fragment(sink, query, status, page)}</div>"
    )


# ---------------------------------------------------------------------- one session


def _reads_now(context: SessionContext) -> str:
    """What the agent reads now, part by part (context.render() is the same, as text)."""
    parts = []
    if context.previous is not None:
        parts.append(
            '<div class="previous"><h3>Earlier visit (generation '
            f"{context.previous.generation})</h3><pre>{escape(context.previous.render())}</pre></div>"
        )
    if context.summary is not None:
        label = f"Summary of {actions_range(1, context.summary_to)}"
        if context.closed:
            label += " (final: the session went idle)"
        parts.append(
            f'<div class="summary"><h3 id="summary-range">{escape(label)}</h3>'
            f'<pre id="summary">{escape(context.summary)}</pre></div>'
        )
        if context.ledger is not None:
            parts.append(
                '<div class="ledger"><h3>Facts (ledger)</h3>'
                f"<pre>{escape(context.ledger.render())}</pre></div>"
            )
    for batch in context.batches:
        parts.append(
            f'<div class="batch" data-range="{batch.seq_from}-{batch.seq_to}">'
            f"<h4>Raw batch: {escape(actions_range(batch.seq_from, batch.seq_to))}</h4>"
            f"<pre>{escape(batch.text)}</pre></div>"
        )
    if not parts:
        parts.append("<p>Nothing yet.</p>")
    return "".join(parts)


def _timeline(context: SessionContext) -> str:
    entries: list[dict[str, Any]] = (context.extra.get(BOOK) or {}).get("timeline", [])
    rows = []
    for e in reversed(entries):
        span = actions_range(e["from"], e["to"])
        if e["kind"] == "batch":
            what = f"batch written: {span}"
        else:
            new = actions_range(e.get("window_from", e["from"]), e["to"])
            what = f"{e['kind']} of {span}: replaced {new} and the summary before them"
        rows.append(
            f'<tr class="op {escape(e["kind"].replace(" ", "-"))}">'
            f"<td>{escape(_when(e['at']))}</td><td>{e['generation']}</td>"
            f"<td>{escape(what)}</td></tr>"
        )
    return (
        "<table><thead><tr><th>When</th><th>Gen.</th><th>Operation</th></tr></thead>"
        f'<tbody id="timeline">{"".join(rows)}</tbody></table>'
    )


def _session_fragment(sink: ViewSink, context: SessionContext | None, session_id: str) -> str:
    version = sink.versions.get(session_id, 0)
    if context is None:
        return f'<p data-version="{version}">No context for this session (erased or unknown).</p>'
    row = row_from(context)
    meta = "".join(
        f"<span><b>{label}</b> {escape(value)}</span>"
        for label, value in (
            ("User", row.user_id or "—"),
            ("Email", row.email or "—"),
            ("Product", row.product_id or "—"),
            ("Actions", str(row.actions)),
            ("Summaries", str(row.summaries)),
            ("Generation", str(row.generation)),
            ("Last activity", _when(row.last_activity)),
        )
    )
    return (
        f'<p class="meta" data-version="{version}">{_status(row.closed)} {meta}</p>'
        '<div class="cols"><section><h2>What the agent reads now</h2>'
        f'<div id="context">{_reads_now(context)}</div>'
        f"<details><summary>As text</summary><pre>{escape(context.render())}</pre></details>"
        f"</section><section><h2>Timeline</h2>{_timeline(context)}</section></div>"
    )


# ---------------------------------------------------------------------- HTTP


def _sse(event: str, data: str) -> bytes:
    lines = "".join(f"data: {line}\n" for line in data.split("\n"))
    return f"event: {event}\n{lines}\n".encode()


async def _stream(
    request: Request, sink: ViewSink, version: Callable[[], int], render: Callable[[], str],
    min_interval: float = 0.0,
) -> aio.StreamResponse:  # fmt: skip
    response = aio.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)  # type: ignore[arg-type]
    sent = -1
    try:
        while True:
            change = sink.next_change()
            if (now := version()) != sent:
                sent = now
                await response.write(_sse("update", render()))
                if min_interval:
                    await asyncio.sleep(min_interval)  # rate limit, not synchronisation
                    continue
            else:
                await response.write(b": keep-alive\n\n")
            await sink.wait(change, KEEPALIVE_S)
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
        strip = await operator_strip(
            sink.settings.metrics_url_list, token.get_secret_value() if token else None
        )
        return _html(web, _page("Sessions", "", strip + _list_body(sink, query, status, page)))

    @app.page("/ui/events")
    async def sessions_events(web: View, request: Request) -> Any:
        if (refused := refuse(web, request)) is not None:
            return refused
        ensure_indexed()
        query, status, page = _list_params(request)
        return await _stream(
            request, sink, lambda: sink.version,
            lambda: _list_fragment(sink, query, status, page), LIST_MIN_INTERVAL_S,
        )  # fmt: skip

    @app.page("/ui/sessions/{session_id}")
    async def session(web: View, request: Request, session_id: str) -> Response:
        if (refused := refuse(web, request)) is not None:
            return refused
        context = context_of(session_id)
        live = f"{_session_url(session_id)}/events"
        body = (
            f'<h1>Session {escape(session_id)}</h1><div id="live" data-live="{escape(live)}">'
            f"{_session_fragment(sink, context, session_id)}</div>"
        )
        return _html(web, _page(f"Session {session_id}", session_id, body), 200 if context else 404)

    @app.page("/ui/sessions/{session_id}/events")
    async def session_events(web: View, request: Request, session_id: str) -> Any:
        if (refused := refuse(web, request)) is not None:
            return refused
        return await _stream(
            request, sink, lambda: sink.versions.get(session_id, 0),
            lambda: _session_fragment(sink, context_of(session_id), session_id),
        )  # fmt: skip
