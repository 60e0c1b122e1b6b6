"""Live-update latency of the session view: a sink's apply to the browser's DOM.

    python scripts/bench_view.py [--operations 200] [--interval 0.1] [--threshold 0]

Starts a pipeline worker and a view worker (``AC_SINK=view``) on the broker at
``KAFKA_BOOTSTRAP_SERVERS`` (topics of their own, deleted at the end), opens one
session's page in headless Chromium, then produces one action at a time. The view
stamps each update with the time its sink applied the operation (the page's
``data-applied``, the worker's clock); a MutationObserver in the page records
``Date.now()`` when the update is in the DOM (the same machine's clock). Prints
p50/p99/max of the difference and how many arrived under a second. An update that
carries two operations (applied between two renders) counts once, for the later one;
their number is printed. ``--threshold N`` lets summaries replace batches every N
actions (0: none). The figures are this machine's, under whatever else runs on it.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import typer
from aiokafka import AIOKafkaProducer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.integration.test_view import chrome
from tests.support.kafka_io import delete_topics_at_the_end
from tests.support.pipeline import Pipeline, settings_from
from tests.support.waiting import wait_for
from tests.support.workers import Worker, unique_env

TOKEN = "bench-view-token"
SID = "bench-view-1"
OBSERVE = """
window.seen = [];
new MutationObserver(function () {
  var meta = document.querySelector("#live .meta");
  if (meta) window.seen.push([Date.now(), Number(meta.dataset.version),
                              Number(meta.dataset.applied)]);
}).observe(document.getElementById("live"), {childList: true});
"""


def action(n: int) -> dict[str, Any]:
    step = {"type": "click", "title": f"Step {n}", "description": f"Clicked {n}"}
    return {"session_id": SID, "product_id": "bench", "user_id": "u-bench", "actions": [step]}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def run(operations: int, interval: float, threshold: int, bootstrap: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="bench-view-"))
    env = unique_env(bootstrap, workdir, AC_API_TOKEN=TOKEN, AC_IDLE_TIMEOUT_S="3600",
                     AC_THRESHOLD=str(threshold or 10**9))  # fmt: skip
    workers: list[Worker] = []
    pipe = Pipeline(env, workdir, workers)
    browser = None
    try:
        view = pipe.start_sink("view")
        await asyncio.gather(pipe.start_pipeline().wait_ready(), view.wait_ready())
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        await producer.start()
        topic = settings_from(env).topic("actions")

        async def send(n: int) -> None:
            await producer.send_and_wait(topic, orjson.dumps(action(n)), key=SID.encode())

        await send(0)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=view.url, headers=auth, timeout=10) as http:

            async def listed() -> bool:
                return (await http.get(f"/ui/sessions/{SID}")).status_code == 200

            await wait_for(listed, timeout=120, message="the first action at the view")
        browser = chrome(workdir)
        browser.get(f"{view.url}/ui/sessions/{SID}?token={TOKEN}")
        await wait_for(lambda: "live" in browser.find_element("id", "live-status").text)
        browser.execute_script(OBSERVE)
        started = time.perf_counter()
        for n in range(1, operations + 1):
            await send(n)
            await asyncio.sleep(interval)  # pacing the load, not waiting for a result
        sent_s = time.perf_counter() - started

        def seen() -> list[list[float]]:
            return list(browser.execute_script("return window.seen"))

        def meta() -> list[str]:
            spans = "document.querySelectorAll('#live .meta span')"
            script = f"return [...{spans}].map(e => e.innerText)"
            return list(browser.execute_script(script))

        await wait_for(
            lambda: f"Actions {operations + 1}" in meta(), timeout=120,
            message=lambda: f"every action in the page (it shows: {meta()})",
        )  # fmt: skip
        await producer.stop()
        updates = seen()
        delays = [max(at - applied * 1000, 0.0) for at, _, applied in updates]
        versions = [int(v) for _, v, _ in updates]
        merged = sum(b - a > 1 for a, b in itertools.pairwise(versions))
        print(f"operations: {operations} produced in {sent_s:.1f}s, {interval * 1000:.0f} ms "
              f"apart; DOM updates: {len(updates)}, carrying two or more: {merged}")  # fmt: skip
        print(f"apply -> DOM: p50 {statistics.median(delays):.0f} ms, "
              f"p99 {percentile(delays, 0.99):.0f} ms, max {max(delays):.0f} ms; "
              f"under 1 s: {sum(d < 1000 for d in delays)}/{len(delays)}")  # fmt: skip
    finally:
        if browser is not None:
            browser.quit()
        for worker in workers:
            worker.stop()
        await delete_topics_at_the_end(env)


def main(
    operations: int = typer.Option(200, min=1, help="actions produced, one at a time"),
    interval: float = typer.Option(0.1, min=0.0, help="seconds between two actions"),
    threshold: int = typer.Option(0, min=0, help="AC_THRESHOLD (0: no summaries)"),
    bootstrap: str = typer.Option("127.0.0.1:9092", envvar="KAFKA_BOOTSTRAP_SERVERS"),
) -> None:
    asyncio.run(run(operations, interval, threshold, bootstrap))


if __name__ == "__main__":
    typer.run(main)
