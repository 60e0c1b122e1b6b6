"""The session view's operator strip: consumer lag per stage, the LLM breaker and
latency, dead letters by reason, read from the workers' own ``/metrics``.

The view worker scrapes the workers named in ``AC_VIEW_METRICS_URLS`` (and itself)
when the list page is rendered; a worker that does not answer is named, not hidden.
tests/integration/test_view.py::test_the_operator_strip_reads_the_workers_metrics proves it.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from html import escape

import httpx
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["fetch", "operator_strip", "summarise"]

SCRAPE_TIMEOUT_S = 2.0


def summarise(texts: list[str]) -> dict[str, object]:
    """The strip's figures from Prometheus exposition texts (one per worker)."""
    lag: dict[str, float] = defaultdict(float)
    letters: dict[str, float] = defaultdict(float)
    breaker, latency_sum, latency_count = 0.0, 0.0, 0.0
    for text in texts:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "ac_consumer_lag":
                    lag[sample.labels.get("group", "?")] += sample.value
                elif sample.name == "ac_dead_letters_total":
                    key = f"{sample.labels.get('stage')}: {sample.labels.get('reason')}"
                    letters[key] += sample.value
                elif sample.name == "ac_llm_breaker_open":
                    breaker = max(breaker, sample.value)
                elif sample.name == "ac_llm_latency_seconds_sum":
                    latency_sum += sample.value
                elif sample.name == "ac_llm_latency_seconds_count":
                    latency_count += sample.value
    mean = latency_sum / latency_count if latency_count else None
    return {"lag": dict(lag), "dead_letters": dict(letters), "breaker_open": breaker >= 1,
            "llm_mean_latency_s": mean, "llm_calls": int(latency_count)}  # fmt: skip


async def fetch(client: httpx.AsyncClient, url: str, path: str = "/metrics") -> str | None:
    """The body a worker answers at ``path`` with a 200; None for anything else."""
    try:
        response = await client.get(f"{url.rstrip('/')}{path}")
        return response.text if response.status_code == 200 else None
    except httpx.HTTPError:
        return None


async def operator_strip(urls: list[str], token: str | None, own: str | None = None) -> str:
    """The strip's HTML (every value escaped): this worker's metrics (``own``, else its
    registry's) and the others'."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx.AsyncClient(timeout=SCRAPE_TIMEOUT_S, headers=headers) as client:
        scraped = await asyncio.gather(*(fetch(client, url) for url in urls))
    own = generate_latest().decode() if own is None else own
    texts = [own, *(t for t in scraped if t is not None)]
    figures = summarise(texts)
    lag = figures["lag"]
    assert isinstance(lag, dict)
    letters = figures["dead_letters"]
    assert isinstance(letters, dict)
    parts = [
        "<strong>Lag</strong> "
        + (", ".join(f"{escape(g)} {int(v)}" for g, v in sorted(lag.items())) or "none reported"),
        "<strong>LLM breaker</strong> " + ("open" if figures["breaker_open"] else "closed"),
    ]
    mean = figures["llm_mean_latency_s"]
    if isinstance(mean, float):
        parts.append(
            f"<strong>LLM</strong> {figures['llm_calls']} calls, mean {mean * 1000:.0f} ms"
        )
    parts.append(
        "<strong>Dead letters</strong> "
        + (", ".join(f"{escape(k)} {int(v)}" for k, v in sorted(letters.items())) or "none")
    )
    missing = [url for url, text in zip(urls, scraped, strict=True) if text is None]
    if missing:
        parts.append("<strong>Not answering</strong> " + ", ".join(escape(u) for u in missing))
    return '<p class="operators" id="operators">' + " · ".join(parts) + "</p>"
