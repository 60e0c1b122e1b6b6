"""The session view's HTML: the page shell, the list and one session, as fragments
the pages and their event streams share. Every value from the event stream is
escaped here (tests/integration/test_view.py::
test_a_summary_replaces_batches_and_everything_is_escaped).
"""

from __future__ import annotations

import math
import time
from html import escape
from string import Template
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from sinks.context import SessionContext, actions_range
from sinks.view.sink import BOOK, SessionRow, row_from

if TYPE_CHECKING:
    from sinks.view.sink import ViewSink

__all__ = [
    "CSP",
    "SCRIPT",
    "STATUSES",
    "html_page",
    "list_body",
    "list_fragment",
    "list_page_rows",
    "session_fragment",
    "session_url",
]  # fmt: skip

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
  source.addEventListener("delivery", function (event) {
    var delivery = document.getElementById("delivery");
    if (delivery) delivery.innerHTML = event.data;
  });
  source.onopen = function () { status.textContent = "live"; };
  source.onerror = function () { status.textContent = "reconnecting…"; };
})();
"""


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) + " UTC" if at else "—"


def session_url(session_id: str) -> str:
    return f"/ui/sessions/{quote(session_id, safe='')}"


def html_page(title: str, heading: str, body: str) -> str:
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


def _list_href(query: str, status: str, page: int, base: str = "/ui/") -> str:
    params = {k: v for k, v in (("q", query), ("status", status), ("page", str(page))) if v}
    if status == "all":
        params.pop("status")
    if page == 1:
        params.pop("page")
    return base + ("?" + urlencode(params) if params else "")


def list_fragment(sink: ViewSink, query: str, status: str, page: int) -> str:
    size = sink.settings.page_size
    rows, matching, pages = list_page_rows(list(sink.rows.values()), query, status, page, size)
    page = min(page, pages)
    cells = "".join(
        f'<tr data-session="{escape(r.session_id)}">'
        f'<td><a href="{escape(session_url(r.session_id))}">{escape(r.session_id)}</a></td>'
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


def list_body(sink: ViewSink, query: str, status: str, page: int) -> str:
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
        f"{list_fragment(sink, query, status, page)}</div>"
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


def _operation(e: dict[str, Any]) -> str:
    span = actions_range(e["from"], e["to"])
    if e["kind"] == "batch":
        what = f"batch written: {span}"
    else:
        new = actions_range(e.get("window_from", e["from"]), e["to"])
        what = f"{e['kind']} of {span}: replaced {new} and the summary before them"
        took = e.get("took_s")
        took_text = (
            "" if took is None else f"{took:.2f} s" if took >= 1 else f"{took * 1000:.0f} ms"
        )
        if took_text and "model" in e:
            what += f"; LLM {took_text} ({e['model']}, {e.get('tokens', 0)} tokens)"
        elif took_text:
            what += f"; summarised offline in {took_text}"
    if redacted := e.get("redacted"):
        what += "; redacted " + ", ".join(f"{k} ×{n}" for k, n in sorted(redacted.items()))
    return what


def _timeline(context: SessionContext, page: int, size: int) -> str:
    """One page of the session's operations, newest first: a long session costs the
    browser ``size`` rows (the sink keeps the last ``AC_VIEW_TIMELINE``)."""
    entries: list[dict[str, Any]] = (context.extra.get(BOOK) or {}).get("timeline", [])
    pages = max(1, math.ceil(len(entries) / size))
    page = min(max(page, 1), pages)
    shown = list(reversed(entries))[(page - 1) * size : page * size]
    rows = "".join(
        f'<tr class="op {escape(e["kind"].replace(" ", "-"))}">'
        f"<td>{escape(_when(e['at']))}</td><td>{e['generation']}</td>"
        f"<td>{escape(_operation(e))}</td>"
        f"<td>{max(e.get('applied', e['at']) - e['at'], 0) * 1000:.0f} ms</td></tr>"
        for e in shown
    )
    url = session_url(context.session_id)
    links = "".join(
        f'<a rel="{rel}" href="{escape(url)}{"" if n == 1 else f"?ops={n}"}">{label}</a>'
        for rel, n, label in (("prev", page - 1, "← newer"), ("next", page + 1, "older →"))
        if 1 <= n <= pages
    )
    return (
        f'<div class="paging"><span id="timeline-count">{len(entries)} operations kept, '
        f"page {page} of {pages}</span>{links}</div>"
        "<table><thead><tr><th>When</th><th>Gen.</th><th>Operation</th>"
        f'<th>To the view</th></tr></thead><tbody id="timeline">{rows}</tbody></table>'
    )


def session_fragment(
    sink: ViewSink, context: SessionContext | None, session_id: str, ops_page: int = 1
) -> str:
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
        f'<p class="meta" data-version="{version}" data-applied="{row.last_activity:.6f}">'
        f"{_status(row.closed)} {meta}</p>"
        '<div class="cols"><section><h2>What the agent reads now</h2>'
        f'<div id="context">{_reads_now(context)}</div>'
        f"<details><summary>As text</summary><pre>{escape(context.render())}</pre></details>"
        "</section><section><h2>Timeline</h2>"
        f"{_timeline(context, ops_page, sink.settings.timeline_page)}</section></div>"
    )
