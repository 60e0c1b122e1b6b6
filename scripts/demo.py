"""The demo: a real broker, the pipeline worker, a files sink, and a synthetic SaaS stream.

Runs with no keys and no network: the offline summarizer stands in for the LLM.
Shows progress while it runs and ends with each session's context as the sink
recorded it, the text an agent reads for a closed session (its final summary
covers the whole session) and for one still going (a summary, then raw actions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.ingest.producer import ActionsProducer  # noqa: E402
from agents.ingest.synthetic import interleaved_payloads, plan_sessions  # noqa: E402
from scripts.bench.measure import metric, scrape  # noqa: E402
from scripts.demo_report import console, show_results  # noqa: E402
from streams.app import worker_command  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    port: int

    def ready(self) -> bool:
        if self.process.poll() is not None:
            raise SystemExit(f"{self.name} worker exited; see {self.log}")
        return "Ready" in self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_worker(name: str, module: str, env: dict[str, str], port: int, run_dir: Path) -> Worker:
    log = run_dir / f"{name}.log"
    process = subprocess.Popen(
        worker_command(module, port),
        cwd=ROOT,
        env={**os.environ, **env, "AC_WEB_PORT": str(port)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    return Worker(name, process, log, port)


async def wait_ready(workers: list[Worker], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(w.ready() for w in workers):
        if time.monotonic() > deadline:
            raise SystemExit(
                f"workers not ready after {timeout:.0f}s; logs in {workers[0].log.parent}"
            )
        await asyncio.sleep(0.2)


async def fetch_contexts(
    client: httpx.AsyncClient, port: int, sessions: list[str]
) -> dict[str, Any]:
    async def one(sid: str) -> tuple[str, Any]:
        response = await client.get(f"http://127.0.0.1:{port}/sessions/{sid}/context")
        return sid, response.json() if response.status_code == 200 else None

    return dict(await asyncio.gather(*(one(s) for s in sessions)))


def progress_bar() -> Progress:
    return Progress(
        TextColumn("{task.description:<40}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[note]}"),
        TimeElapsedColumn(),
        console=console,
    )


async def run(args: argparse.Namespace) -> None:
    run_id = time.strftime("%Y%m%d-%H%M%S")
    run_dir = ROOT / ".demo" / run_id
    run_dir.mkdir(parents=True)
    env = {
        "AC_APP_ID": f"demo-{run_id}",
        "AC_TOPIC_PREFIX": f"demo-{run_id}.",
        "AC_DATA_DIR": str(run_dir / "state"),
        "AC_FILES_DIR": str(run_dir / "context"),
        "AC_THRESHOLD": str(args.threshold),
        "AC_IDLE_TIMEOUT_S": str(args.idle_timeout),
        "AC_IDLE_CHECK_INTERVAL_S": "1",
        "AC_PARTITIONS": "4",
        "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
    }
    for secret in ("OPENAI_API_KEY", "AC_LLM_API_KEY", "AC_LLM_CALLABLE"):
        os.environ.pop(secret, None)  # the demo always runs offline
    settings = Settings(
        kafka_bootstrap_servers=args.bootstrap, topic_prefix=env["AC_TOPIC_PREFIX"], partitions=4
    )
    plans = plan_sessions(args.sessions, mean_length=args.mean_length, seed=args.seed)
    payloads = list(interleaved_payloads(plans, seed=args.seed))
    total_actions = sum(len(p["actions"]) for p in payloads)
    sessions = [p.session_id for p in plans]

    console.print(
        Panel.fit(
            f"broker [bold]{args.bootstrap}[/] · {args.sessions} sessions · "
            f"{total_actions} actions in {len(payloads)} batches · "
            f"summary every K={args.threshold} actions\n"
            f"summarizer: built-in offline (no LLM key needed) · destination: files sink\n"
            f"run {run_id}: state and logs in {run_dir.relative_to(ROOT)}",
            title="agent context on Kafka: demo",
        )
    )
    await ensure_topics(settings)
    console.print("[1/4] starting the pipeline worker, the files sink and the session view ...")
    started = time.monotonic()
    pipeline = start_worker("pipeline", "agents.app", env, args.port, run_dir)
    sink = start_worker(
        "sink-files", "sinks.app", {**env, "AC_SINK": "files"}, args.port + 1, run_dir
    )
    others = f"http://127.0.0.1:{args.port},http://127.0.0.1:{args.port + 1}"
    view_env = {**env, "AC_SINK": "view", "AC_VIEW_METRICS_URLS": others}
    view = start_worker("sink-view", "sinks.app", view_env, args.port + 2, run_dir)
    workers = [pipeline, sink, view]
    try:
        await wait_ready(workers)
        console.print(f"      all ready in {time.monotonic() - started:.1f}s")
        async with httpx.AsyncClient(timeout=10) as client:
            await produce_stream(settings, payloads)
            await follow_sink(
                client, sink.port, sessions, payloads, total_actions, args.idle_timeout
            )
            live = await live_session(client, settings, sink.port, args.threshold)
            contexts = await fetch_contexts(client, sink.port, [*sessions, live["session_id"]])
            scraped = await scrape(client, pipeline.port)
        compiled = metric(scraped, "ac_compiled_payloads_total")
        requests = metric(scraped, "ac_compiled_requests_total")
        applied = len(payloads) + len(live["payloads"])
        console.print(
            f"      the pipeline worker applied {applied} payloads: {compiled:.0f} by the "
            f"compiled transition (native/), {applied - compiled:.0f} by the Python one; "
            f"it read {requests:.0f} summarize requests compiled"
        )
        show_results(contexts, payloads, run_dir, args.threshold, live)
        url = f"http://127.0.0.1:{view.port}/ui/"
        if args.exit if args.exit is not None else not sys.stdin.isatty():
            console.print(
                f"Session view: {url} (stopped with the workers now; run the demo with --keep "
                "to keep them running for the page)"
            )
            return
        console.print(f"Watch the sessions in a browser: {url}  (Ctrl-C stops the workers)")
        await asyncio.Event().wait()  # until Ctrl-C: the page needs its workers
    finally:
        for worker in workers:
            worker.stop()


LIVE_SESSION = "ps_live_going"


async def live_session(
    client: httpx.AsyncClient, settings: Settings, port: int, k: int
) -> dict[str, Any]:
    """A session still going when the demo ends: K + 3 actions, so the agent reads a
    summary of the first K and the 3 raw actions after it (the usual state)."""
    plan = plan_sessions(1, mean_length=k + 3, seed=99, prefix="live")[0]
    plan = type(plan)(LIVE_SESSION, plan.user_id, plan.email, k + 3)
    actions = [a for p in interleaved_payloads([plan], seed=99) for a in p["actions"]]
    first: dict[str, Any] = {"type": "actions", "session_id": LIVE_SESSION}
    first.update(product_id="prod_demo", actions=actions[:k])
    payloads = [first, {**first, "actions": actions[k:]}]  # a summary, then 3 after it
    console.print(f"      and one session still going: {LIVE_SESSION}, {plan.length} actions")
    async with ActionsProducer.from_settings(settings) as producer:
        for payload in payloads:
            await producer.add(payload)
    n = sum(len(p["actions"]) for p in payloads)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        view = (await fetch_contexts(client, port, [LIVE_SESSION]))[LIVE_SESSION]
        if view and view["actions_applied"] == n and view["summary_covers"]:
            return {"session_id": LIVE_SESSION, "payloads": payloads}
        await asyncio.sleep(0.2)
    raise SystemExit("the live session's summary did not arrive within 2 minutes")


async def produce_stream(settings: Settings, payloads: list[dict[str, Any]]) -> None:
    with progress_bar() as progress:
        task = progress.add_task(
            "[2/4] producing the stream to Kafka", total=len(payloads), note=""
        )
        async with ActionsProducer.from_settings(settings) as producer:
            for payload in payloads:
                await producer.add(
                    payload
                )  # acknowledged by the broker, like a connector would wait
                progress.advance(task)


async def follow_sink(
    client: httpx.AsyncClient,
    port: int,
    sessions: list[str],
    payloads: list[dict[str, Any]],
    total_actions: int,
    idle_timeout: float,
) -> None:
    per_session = {s: 0 for s in sessions}
    for p in payloads:
        per_session[str(p["session_id"])] += len(p["actions"])
    with progress_bar() as progress:
        applied = progress.add_task(
            "[3/4] actions applied at the sink", total=total_actions, note=""
        )
        closed = progress.add_task(
            f"[4/4] sessions summarised (idle {idle_timeout:g}s)", total=len(sessions), note=""
        )
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            contexts = await fetch_contexts(client, port, sessions)
            live = [c for c in contexts.values() if c]
            done_actions = sum(c["actions_applied"] for c in live)
            summaries = sum(c["summaries"] for c in live)
            finished = sum(
                1
                for sid, c in contexts.items()
                if c and c["closed"] and c["summary_covers"] == [1, per_session[sid]]
            )
            progress.update(applied, completed=done_actions, note=f"{summaries} summaries")
            progress.update(closed, completed=finished, note="")
            if finished == len(sessions):
                return
            await asyncio.sleep(0.5)
    raise SystemExit("the sink did not finish within 10 minutes; see the logs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--sessions", type=int, default=36)
    parser.add_argument("--mean-length", type=int, default=40)
    parser.add_argument("--threshold", type=int, default=10)
    parser.add_argument("--idle-timeout", type=float, default=6.0)
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument(
        "--port",
        type=int,
        default=6066,
        help="web port of the pipeline; the files sink uses +1, the session view +2",
    )
    parser.add_argument(
        "--exit",
        action="store_true",
        default=None,
        help="stop the workers at the end (the default without a TTY)",
    )
    parser.add_argument(
        "--keep", dest="exit", action="store_false", help="keep the workers for the session view"
    )
    try:
        asyncio.run(run(parser.parse_args()))
    except KeyboardInterrupt:
        console.print("stopped; the broker keeps running (make stop)")


if __name__ == "__main__":
    main()
