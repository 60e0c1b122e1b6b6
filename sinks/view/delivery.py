"""Per-sink delivery of one session, for its page: how far each other sink has got.

Every sink worker serves the pull view (``/sessions/{id}/context``) and its
``/metrics``; the view asks the workers named in ``AC_VIEW_METRICS_URLS`` for both
and compares their generation, actions and summaries with its own context.
Retries and refusals are the worker's counters (Prometheus keeps no per-session
figures). tests/integration/test_view.py::test_delivery_compares_each_sink_with_the_view proves it.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from html import escape
from typing import Any
from urllib.parse import quote

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sinks.context import SessionContext
from sinks.view.operators import SCRAPE_TIMEOUT_S, fetch

__all__ = ["SinkDelivery", "delivery", "delivery_fragment"]


@dataclass
class SinkDelivery:
    """What one worker answers about one session."""

    url: str
    sinks: list[str] = field(default_factory=list)  # the sinks its metrics name
    retries: int = 0  # worker-wide, since it started
    refused: int = 0  # worker-wide: operations dead-lettered by the destination
    session: dict[str, Any] | None = None  # its pull view of the session (None: nothing)
    answered: bool = False


def _counters(text: str) -> tuple[list[str], int, int]:
    sinks: set[str] = set()
    retries = refused = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "ac_sink_retries_total":
                sinks.add(sample.labels.get("sink", "?"))
                retries += sample.value
            elif sample.name == "ac_sink_operations_total":
                sinks.add(sample.labels.get("sink", "?"))
                refused += sample.value if sample.labels.get("outcome") == "refused" else 0
    return sorted(sinks), int(retries), int(refused)


async def _one(client: httpx.AsyncClient, url: str, session_id: str) -> SinkDelivery:
    metrics, pulled = await asyncio.gather(
        fetch(client, url), fetch(client, url, f"/sessions/{quote(session_id, safe='')}/context")
    )
    found = SinkDelivery(url, answered=metrics is not None)
    if metrics is not None:
        found.sinks, found.retries, found.refused = _counters(metrics)
    if pulled is not None:
        found.session = json.loads(pulled)
    return found


async def delivery(urls: list[str], token: str | None, session_id: str) -> list[SinkDelivery]:
    """The workers that answer as sinks (a pipeline worker has neither figure)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S, headers=headers) as client:
        found = await asyncio.gather(*(_one(client, url, session_id) for url in urls))
    return [d for d in found if d.sinks or d.session is not None or not d.answered]


def _state(d: SinkDelivery, context: SessionContext) -> str:
    if not d.answered:
        return "not answering"
    if d.session is None:
        return "nothing delivered" if context.actions_to else "up to date"
    theirs = (d.session["generation"], d.session["actions_applied"], d.session["summaries"])
    ours = (context.generation, context.actions_to, context.summaries)
    if theirs >= ours:
        return "up to date"
    return f"behind: {ours[1] - theirs[1] if theirs[0] == ours[0] else ours[1]} actions pending"


def delivery_fragment(found: list[SinkDelivery], context: SessionContext | None) -> str:
    """The delivery table's HTML, every value escaped."""
    if context is None:
        return ""
    rows = [
        "<tr><td>view (this worker)</td><td>up to date</td>"
        f"<td>{context.generation}</td><td>{context.actions_to}</td>"
        f"<td>{context.summaries}</td><td>—</td><td>—</td></tr>"
    ]
    for d in found:
        session = d.session or {}
        rows.append(
            f'<tr data-worker="{escape(d.url)}"><td>{escape(", ".join(d.sinks) or "?")} '
            f"({escape(d.url)})</td><td>{escape(_state(d, context))}</td>"
            + "".join(
                f"<td>{escape(str(session.get(k, '—')))}</td>"
                for k in ("generation", "actions_applied", "summaries")
            )
            + f"<td>{d.retries}</td><td>{d.refused}</td></tr>"
        )
    return (
        "<table><thead><tr><th>Sink</th><th>State</th><th>Gen.</th><th>Actions</th>"
        "<th>Summaries</th><th>Retries (worker)</th><th>Refused (worker)</th></tr></thead>"
        f'<tbody id="delivery-rows">{"".join(rows)}</tbody></table>'
    )
