"""The vector sink against the real broker: a pipeline worker, a vector sink worker
killed mid-stream and restarted, the store read back, the query API over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import lancedb
import pytest

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from tests.integration.test_cli import cli
from tests.support.pipeline import Pipeline, expected_summary_ranges, produce
from tests.support.waiting import wait_for
from tests.support.workers import FAST_REBALANCE, Worker

TOKEN = "vector-api-token-for-tests"
NEEDLE, TENANT = "needle-session", "tenant-b"
PHRASE = "Configured the Zendesk webhook signing secret"


def needle_payloads(threshold: int) -> list[dict[str, Any]]:
    """Another tenant's session whose last summarised action is the phrase, then a raw tail."""

    def batch(titles: list[str], at: float) -> dict[str, Any]:
        actions = [
            {"index": i, "type": "click", "title": t, "description": t, "canonical_url": "/hooks"}
            for i, t in enumerate(titles)
        ]
        return {"type": "actions", "product_id": TENANT, "session_id": NEEDLE,
                "user_id": "u-needle", "forwarded_at": at, "actions": actions}  # fmt: skip

    filler = [f"Opened settings tab {i}" for i in range(threshold)]
    return [
        batch(filler, 1.7e9),
        batch([f"Read the docs page {i}" for i in range(threshold - 1)] + [PHRASE], 1.7e9 + 60),
        batch(["Clicked Save", "Opened the activity log"], 1.7e9 + 120),  # raw, after it
    ]


def current_rows(store: Path) -> list[dict[str, Any]]:
    """The store as a reader in another process sees it now."""
    if not store.exists():
        return []
    try:
        table = lancedb.connect(str(store)).open_table("context_vectors")
    except (ValueError, FileNotFoundError):
        return []
    columns = ["id", "session_id", "product_id", "kind", "seq_from", "seq_to"]
    return table.to_arrow().select(columns).to_pylist()  # type: ignore[no-any-return]


@pytest.mark.kafka
async def test_200_sessions_each_current_summary_once_search_and_enrich(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 6
    payloads: list[dict[str, Any]] = list(
        interleaved_payloads(plan_sessions(199, mean_length=14, seed=11), seed=11)
    )
    payloads += needle_payloads(threshold)
    crossings = expected_summary_ranges(payloads, threshold)
    want = {sid: ranges[-1] for sid, ranges in crossings.items()}
    assert len({str(p["session_id"]) for p in payloads}) == 200 and want[NEEDLE] == 2 * threshold
    env = {**worker_env, **FAST_REBALANCE, "AC_THRESHOLD": str(threshold),
           "AC_IDLE_TIMEOUT_S": "3600", "AC_API_TOKEN": TOKEN}  # fmt: skip
    store = Path(env["AC_DATA_DIR"]) / "vector"
    pipe = Pipeline(env, tmp_path, workers)
    started = [pipe.start_pipeline(), pipe.start_sink("vector")]
    await asyncio.gather(*(w.wait_ready() for w in started))

    # Half the stream, a kill -9 once the sink has stored some of it, the rest.
    half = len(payloads) // 2
    await produce(pipe.env, payloads[:half])
    await wait_for(lambda: len(current_rows(store)) >= 20, timeout=90, message="no rows")
    started[1].kill()
    sink = await pipe.start_sink("vector").wait_ready()
    await produce(pipe.env, payloads[half:])

    def summaries() -> dict[str, int]:
        return {r["session_id"]: r["seq_to"] for r in current_rows(store) if r["kind"] == "summary"}

    def settled() -> bool:
        # The new summary is stored before the one it replaces is deleted (a reader never
        # finds none): wait for the deletes too, not only for the latest ranges.
        return summaries() == want and len(current_rows(store)) == len(want)

    await wait_for(
        settled,
        timeout=180,
        interval=0.5,
        message=lambda: f"{len(summaries())}/{len(want)} sessions current",
    )
    rows = current_rows(store)
    # Exactly once: one row per session (redeliveries after the kill overwrote their
    # ids), none superseded left, every row the session's latest range.
    assert len(rows) == len(want) == len({r["id"] for r in rows})
    assert all(r["kind"] == "summary" and r["seq_from"] == 1 for r in rows)
    assert {r["product_id"] for r in rows if r["session_id"] == NEEDLE} == {TENANT}

    async with httpx.AsyncClient(base_url=sink.url, timeout=30) as anyone:
        # The pull view's access control: without the token, no session data.
        for path in ("/search", f"/sessions/{NEEDLE}/enrich"):
            refused = await anyone.get(path, params={"q": "zendesk webhook secret"})
            assert refused.status_code == 401 and NEEDLE not in refused.text, path
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=sink.url, timeout=30, headers=auth) as http:
        found = (await http.get("/search", params={"q": "zendesk webhook secret", "k": 5,
                                                   "product_id": TENANT})).json()  # fmt: skip
        assert found["results"][0]["session_id"] == NEEDLE
        assert PHRASE in found["results"][0]["summary"]
        anywhere = (await http.get("/search", params={"q": "zendesk webhook secret"})).json()
        assert anywhere["results"][0]["session_id"] == NEEDLE  # seeded: ranks first
        other = (await http.get("/search", params={"q": "zendesk webhook secret",
                                                   "product_id": "prod_demo"})).json()  # fmt: skip
        assert NEEDLE not in {r["session_id"] for r in other["results"]}  # tenants apart

        query = "How do I rotate the secret?"
        enriched = (await http.get(f"/sessions/{NEEDLE}/enrich", params={"q": query})).json()
        text = enriched["text"]
        assert text.startswith("[Session context]\nSummary: ") and text.endswith(
            f"\n\n[Query]\n{query}"
        )
        assert PHRASE in text.split("Recent activity:")[0]  # in the summary only
        activity = text.split("Recent activity:\n")[1].split("\n\n[Query]")[0].splitlines()
        assert activity == [
            f"1. [{2 * threshold + 1}] click: Clicked Save — /hooks",
            f"2. [{2 * threshold + 2}] click: Opened the activity log — /hooks",
        ]
        hidden = await http.get(
            f"/sessions/{NEEDLE}/enrich", params={"q": query, "product_id": "prod_demo"}
        )
        assert hidden.json()["text"] == query  # another tenant's session: no context

    # The same from a shell.
    found_cli = await cli(env, "search", "zendesk webhook secret", "--url", sink.url,
                          "--product-id", TENANT)  # fmt: skip
    assert found_cli.returncode == 0 and NEEDLE in found_cli.stdout.splitlines()[0]
    enriched_cli = await cli(env, "search", query, "--session", NEEDLE, "--url", sink.url)
    assert enriched_cli.stdout.rstrip("\n") == text
