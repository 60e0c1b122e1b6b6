"""Benchmark: what durability costs, on one workload, in one run.

  (a) raw aiokafka consumption of the `actions` topic (the ceiling for a Python consumer)
  (b) the in-process autoplay_sdk AsyncAgentContextWriter + AsyncSessionSummarizer (no Kafka)
  (c) our pipeline end to end: actions -> tables -> context -> a null sink, instant LLM
  latency: p50/p99 from produce to application at the sink, at a fixed offered rate
  --mode summarizer: 2,000 sessions, an LLM that takes 500 ms: summaries per second
  --mode accumulate: the pipeline worker alone on a backlog, to durable and summarised,
    beside (b) and our accumulator's transition alone in this process (what the rest costs)

Prints figures and ratios; it is not a test. Needs the broker (make broker).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import random
import re
import resource
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from streams.partitions import partition_of  # noqa: E402
from streams.settings import Settings  # noqa: E402
from streams.topics import ensure_topics  # noqa: E402


def workload(
    actions: int, sessions: int, seed: int, *, min_batch: int, max_batch: int, stamp: bool = False
) -> list[dict[str, Any]]:
    """Interleaved batches of 1-3 actions over `sessions` sessions, `actions` in total."""
    rng = random.Random(seed)
    per_session = [actions // sessions] * sessions
    next_index = [0] * sessions
    payloads: list[dict[str, Any]] = []
    live = list(range(sessions))
    while live:
        i = rng.choice(live)
        n = min(rng.randint(min_batch, max_batch), per_session[i] - next_index[i])
        sid = f"bench-{seed}-{i:05d}"
        acts = [
            {
                "index": next_index[i] + j,
                "type": "click",
                "title": f"Button {j}",
                "description": f"User clicked button {j} on the page",
                "canonical_url": "https://app.example.com/projects/:id",
                "timestamp_start": 0.0,
                "timestamp_end": 0.0,
                "session_id": sid,
            }
            for j in range(n)
        ]
        next_index[i] += n
        payloads.append(
            {
                "type": "actions",
                "product_id": "bench",
                "session_id": sid,
                "actions": acts,
                "count": n,
                "forwarded_at": 0.0,
            }
        )
        if next_index[i] >= per_session[i]:
            live.remove(i)
    # Millions of objects that live to the end: out of the cyclic GC's scans, or a full
    # collection pauses the load generator for up to 130 ms mid-measurement (found
    # with a gc.callbacks probe), and the workers are charged for the burst after it.
    gc.freeze()
    return payloads


def idle_sessions(sessions: int, seed: int) -> list[dict[str, Any]]:
    """One payload of 2 actions per session (under K: nothing to summarise), in O(n)."""
    template = workload(2, 1, seed, min_batch=2, max_batch=2)[0]
    out = []
    for i in range(sessions):
        sid = f"idle-{seed}-{i:07d}"
        actions = [{**a, "session_id": sid} for a in template["actions"]]
        out.append({**template, "session_id": sid, "actions": actions})
    return out


PACING_TICK_S = 0.002


async def produce(
    bootstrap: str, topic: str, payloads: list[dict[str, Any]], rate: float | None = None
) -> None:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, linger_ms=5, acks="all", max_batch_size=256 * 1024
    )
    await producer.start()
    try:
        if rate is None:
            futures = [
                await producer.send(topic, orjson.dumps(p), key=p["session_id"].encode())
                for p in payloads
            ]
        else:
            futures = await _produce_paced(producer, topic, payloads, rate)
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _produce_paced(
    producer: AIOKafkaProducer, topic: str, payloads: list[dict[str, Any]], rate: float
) -> list[asyncio.Future[Any]]:
    """Offer ``payloads`` at ``rate``, in ticks of 2 ms: each tick's payloads go out as one
    batch per partition. The generator shares the two cores with what it measures; a
    timer per payload took a quarter of one at 5,000 actions/s, a ``send`` per payload
    still a sixth. (Not ``streams._faust.appender``: with its per-round acknowledgements the
    generator took 20% of a core against 12% with this loop.)"""
    partitions = len(await producer.partitions_for(topic))
    futures, start, n = [], time.perf_counter(), 0
    while n < len(payloads):
        if (delay := start + n / rate - time.perf_counter()) > 0:
            await asyncio.sleep(max(delay, PACING_TICK_S))
        due = min(len(payloads), int((time.perf_counter() - start) * rate) + 1)
        batches: dict[int, Any] = {}
        now = time.time()  # the actions happen now: latency starts here
        for p in payloads[n:due]:
            for a in p["actions"]:
                a["timestamp_end"] = now
            key = p["session_id"].encode()
            partition = partition_of(key, partitions)  # as the default partitioner
            if (batch := batches.get(partition)) is None:
                batch = batches[partition] = producer.create_batch()
            if batch.append(key=key, value=orjson.dumps(p), timestamp=None) is None:
                batch.close()
                futures.append(await producer.send_batch(batch, topic, partition=partition))
                batch = batches[partition] = producer.create_batch()
                batch.append(key=key, value=orjson.dumps(p), timestamp=None)
        for partition, batch in batches.items():
            # Closed: the tick's batch is complete. An open one lingers in the producer
            # (linger_ms), which added up to 5 ms to every action's measured latency.
            batch.close()
            futures.append(await producer.send_batch(batch, topic, partition=partition))
        n = due
    return futures


async def bench_raw_consumer(
    bootstrap: str, topic: str, expected_messages: int, actions: int
) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    try:
        seen, start = 0, time.perf_counter()
        while seen < expected_messages:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            seen += sum(len(records) for records in batches.values())
        return actions / (time.perf_counter() - start)
    finally:
        await consumer.stop()


async def records_in(bootstrap: str, topic: str, partitions: int) -> int:
    """How many records ``topic`` holds (the sum of its partitions' end offsets)."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        ends = await consumer.end_offsets([TopicPartition(topic, p) for p in range(partitions)])
        return sum(ends.values())
    finally:
        await consumer.stop()


def faust_worker(module: str, port: int) -> list[str]:
    """The command of a `faust worker` (``-l info``: ``-l warn`` leaves the root logger at
    DEBUG under Faust's spinner, which costs a log record per message)."""
    return [
        sys.executable,
        "-m",
        "faust",
        "-A",
        module,
        "worker",
        "-l",
        "info",
        "--web-port",
        str(port),
    ]


def bench_faust_floor(
    env: dict[str, str], messages: int, actions: int, port: int, mode: str
) -> float:
    """A consumer doing nothing with the same topic (scripts/bench_floor.py):
    ``agent``, Faust's per-message delivery (a'); ``batch``, our BatchSource (a'')."""
    proc = subprocess.run(
        faust_worker("scripts.bench_floor", port),
        cwd=ROOT,
        env={
            **os.environ,
            **env,
            "BENCH_FLOOR_MESSAGES": str(messages),
            "BENCH_FLOOR_MODE": mode,
        },
        capture_output=True,
        timeout=900,
        check=False,
    )
    found = re.search(rb"FLOOR (\d+)", proc.stdout + proc.stderr)
    if not found:
        raise SystemExit(f"the Faust floor run failed:\n{proc.stderr.decode()[-2000:]}")
    return int(found.group(1)) * actions / messages


async def bench_sdk(payload_bytes: list[bytes], actions: int, threshold: int) -> float:
    from autoplay_sdk import AsyncSessionSummarizer
    from autoplay_sdk.context.agent_context import AsyncAgentContextWriter
    from autoplay_sdk.core.models import ActionsPayload as SdkPayload

    async def llm(prompt: str) -> str:
        return "summary"

    async def noop(session_id: str, text: str) -> None:
        return None

    summarizer = AsyncSessionSummarizer(llm=llm, threshold=threshold)
    writer = AsyncAgentContextWriter(
        summarizer=summarizer, write_actions=noop, overwrite_with_summary=noop
    )
    start = time.perf_counter()
    for raw in payload_bytes:  # what a consumer of the SSE stream does per event
        await writer.add(SdkPayload.from_dict(orjson.loads(raw)))
    await summarizer.flush()
    return actions / (time.perf_counter() - start)


def bench_transition(payload_bytes: list[bytes], actions: int, threshold: int) -> float:
    """Our accumulator's own work per payload, in this process: no Kafka, no summarizer.

    What (c) does beside the SDK's work, minus the plumbing: decode and validate the
    payload, load the session's entry, apply it (the stored batch, the operation, the
    summarize request at K), encode the entry again.
    """
    from agents.accumulate.state import Limits, MemoryBatchStore, SessionState, apply_payload
    from schemas import ActionsPayload, decode

    limits = Limits(threshold=threshold, max_actions_per_batch=Settings().max_actions_per_batch)
    store, entries = MemoryBatchStore(), dict[str, bytes]()
    start = time.perf_counter()
    for offset, raw in enumerate(payload_bytes):
        payload = decode(ActionsPayload, raw)
        entry = entries.get(payload.session_id)
        state = None if entry is None else SessionState.from_bytes(entry)
        state, _ = apply_payload(state, payload, offset, limits, store=store)
        entries[payload.session_id] = state.to_bytes()
    return actions / (time.perf_counter() - start)


class Workers:
    """The pipeline worker and a null sink worker, as `faust worker` processes.

    The newest ``Workers`` is the one ``wait_metric`` checks for a crashed worker.
    """

    def __init__(self, env: dict[str, str], run_dir: Path, port: int) -> None:
        global WORKERS
        self.env, self.run_dir, self.port = env, run_dir, port
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        WORKERS = self

    def start(self, module: str, name: str, port: int, **extra: str) -> None:
        log = self.run_dir / f"{name}.log"
        proc = subprocess.Popen(
            faust_worker(module, port),
            cwd=ROOT,
            env={**os.environ, **self.env, **extra, "AC_WEB_PORT": str(port)},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.procs.append((proc, log))

    def check_alive(self) -> None:
        for proc, log in self.procs:
            if proc.poll() is not None:
                raise SystemExit(f"\na worker exited; see {log}:\n{log.read_text()[-2000:]}")

    def peak_rss_mb(self) -> list[float]:
        out = []
        for proc, _ in self.procs:
            status = Path(f"/proc/{proc.pid}/status")
            match = re.search(r"VmHWM:\s+(\d+) kB", status.read_text()) if status.exists() else None
            out.append(int(match.group(1)) / 1024 if match else float("nan"))
        return out

    def cpu_seconds(self) -> list[float]:
        """User + system CPU time of each worker so far (from /proc/<pid>/stat)."""
        out = []
        for proc, _ in self.procs:
            fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out.append((int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
        return out

    def rss_mb(self, index: int = 0) -> float:
        status = Path(f"/proc/{self.procs[index][0].pid}/status")
        match = re.search(r"VmRSS:\s+(\d+) kB", status.read_text()) if status.exists() else None
        return int(match.group(1)) / 1024 if match else float("nan")

    def stop(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


WORKERS: Workers | None = None  # checked while waiting, so a crashed worker fails fast


def metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and all(f'{k}="{v}"' in line for k, v in labels.items()):
            if line[len(name)] in " {":
                total += float(line.rsplit(" ", 1)[1])
    return total


async def scrape(client: httpx.AsyncClient, port: int) -> str:
    try:
        return (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    except httpx.HTTPError:
        return ""


async def wait_metric(
    client: httpx.AsyncClient,
    port: int,
    name: str,
    target: float,
    label: str,
    timeout: float = 900,
    **labels: str,
) -> float:
    """Poll until the metric reaches target; prints progress; returns the time it did."""
    deadline = time.monotonic() + timeout
    last, shown = -1.0, 0.0
    while time.monotonic() < deadline:
        value = metric(await scrape(client, port), name, **labels)
        if value != last and time.monotonic() - shown > 1:
            print(f"  {label}: {value:,.0f}/{target:,.0f}", flush=True)
            last, shown = value, time.monotonic()
        if value >= target:
            print(f"  {label}: {value:,.0f} done")
            return time.perf_counter()
        if WORKERS is not None:
            WORKERS.check_alive()
        await asyncio.sleep(0.05)
    raise SystemExit(f"\n{label}: stuck at {last} of {target}")


async def wait_healthy(client: httpx.AsyncClient, ports: list[int], timeout: float = 120) -> None:
    """Until every worker's /healthz says it is consuming (assigned, recovered, running)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        codes = []
        for port in ports:
            try:
                codes.append((await client.get(f"http://127.0.0.1:{port}/healthz")).status_code)
            except httpx.HTTPError:
                codes.append(0)
        if all(code == 200 for code in codes):
            return
        if WORKERS is not None:
            WORKERS.check_alive()
        await asyncio.sleep(0.1)
    raise SystemExit(f"workers not healthy within {timeout:.0f}s")


def changelog_bytes(kafka_data: Path, app_id: str) -> int:
    total = 0
    for path in kafka_data.glob(f"{app_id}-*changelog-*/*.log"):
        total += path.stat().st_size
    return total


def pipeline_env(args: argparse.Namespace, tag: str, run_dir: Path) -> dict[str, str]:
    """The workers' settings for one run: its own app id, topics and state directory."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "AC_APP_ID": f"bench-{tag}",
        "AC_TOPIC_PREFIX": f"bench-{tag}.",
        "AC_PARTITIONS": str(args.partitions),
        "AC_DATA_DIR": str(run_dir / "state"),
        "AC_THRESHOLD": str(args.threshold),
        "AC_LLM_CALLABLE": "scripts.bench_plugins:instant",
        "AC_STORE": args.store,
        "AC_IDLE_TIMEOUT_S": "3600",
    }


async def new_run(args: argparse.Namespace) -> tuple[dict[str, str], Path]:
    """A fresh run's settings, with its topics created (and empty)."""
    tag = uuid.uuid4().hex[:6]
    run_dir = ROOT / ".bench" / tag
    run_dir.mkdir(parents=True)
    env = pipeline_env(args, tag, run_dir)
    await ensure_topics(settings_of(args, env))
    return env, run_dir


def settings_of(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    return Settings(
        kafka_bootstrap_servers=args.bootstrap,
        topic_prefix=env["AC_TOPIC_PREFIX"],
        partitions=args.partitions,
    )


async def offer_backlog(
    args: argparse.Namespace, env: dict[str, str], payloads: list[dict[str, Any]]
) -> float:
    """Produce ``payloads`` as fast as the producer goes; returns when it started.

    The workers are up and consuming by then, so every action's work falls after
    that moment: a worker started on a pre-filled topic had applied ~26,000 actions
    before its first ``/metrics`` answer, and a window opened there either missed
    their work or took in their durability (found: 160 µs per action on a 40,000-action
    run, against ~90 on a 150,000-action one).
    """
    topic = settings_of(args, env).topic("actions")
    print(f"  producing {len(payloads):,} payloads to {topic} ...")
    start = time.perf_counter()
    await produce(args.bootstrap, topic, payloads)
    return start


async def accumulator_done(
    client: httpx.AsyncClient, args: argparse.Namespace, prefix: str, payloads: int
) -> float:
    """Wait until every payload on the pipeline worker is acknowledged (what it produced,
    then its table writes, are in the broker), and so is every summarize request it led
    to; returns when.

    Not when the last action is applied: the write-behind lets the accumulator run up
    to 32 batches ahead of durability, and the summarize agent runs behind it (found:
    with 4,000-record batches the accumulator "applied" twice as fast, at half the CPU
    per action, while its durability and its summaries waited until after the window).
    """
    acked = "ac_records_acknowledged_total"
    await wait_metric(
        client, args.port, acked, payloads, "payloads durable", topic=prefix + "actions"
    )
    requests = await records_in(args.bootstrap, prefix + "summarize", args.partitions)
    return await wait_metric(
        client, args.port, acked, requests, "summarize requests done", topic=prefix + "summarize"
    )


async def bench_accumulate(
    args: argparse.Namespace, payloads: list[dict[str, Any]], actions: int
) -> dict[str, float]:
    """The pipeline worker alone on a backlog: actions/s and CPU per action, from the
    backlog's first record to ``accumulator_done``."""
    env, run_dir = await new_run(args)
    workers = Workers(env, run_dir, args.port)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("agents.app", "pipeline", args.port)
            await wait_healthy(client, [args.port])
            cpu_start = workers.cpu_seconds()[0]
            start = await offer_backlog(args, env, payloads)
            done = await accumulator_done(client, args, env["AC_TOPIC_PREFIX"], len(payloads))
            cpu = workers.cpu_seconds()[0] - cpu_start
            rss = workers.peak_rss_mb()[0]
    finally:
        workers.stop()
    return {
        "rate": actions / (done - start),
        "cpu_us_per_action": cpu * 1e6 / actions,
        "rss_mb": rss,
    }


async def bench_pipeline(
    args: argparse.Namespace, payloads: list[dict[str, Any]], actions: int
) -> dict[str, Any]:
    env, run_dir = await new_run(args)
    workers = Workers(env, run_dir, args.port)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("agents.app", "pipeline", args.port)
            workers.start("sinks.app", "sink-null", args.port + 1, AC_SINK="null")
            await wait_healthy(client, [args.port, args.port + 1])
            cpu_start = workers.cpu_seconds()
            start = await offer_backlog(args, env, payloads)
            t_accumulated = await accumulator_done(
                client, args, env["AC_TOPIC_PREFIX"], len(payloads)
            )
            pipeline_cpu = workers.cpu_seconds()[0] - cpu_start[0]
            t_applied = await wait_metric(
                client,
                args.port + 1,
                "ac_sink_operations_total",
                len(payloads),  # actions_written operations; summaries are counted apart
                "batches applied at the null sink",
                op="actions_written",
            )
            rss = workers.peak_rss_mb()
            sink_cpu = workers.cpu_seconds()[1] - cpu_start[1]
    finally:
        workers.stop()
    kafka_data = Path(
        os.environ.get("KAFKA_DATA", ROOT / ".kafka-data" / args.bootstrap.rsplit(":", 1)[1])
    )
    cl_bytes = changelog_bytes(kafka_data / "logs", env["AC_APP_ID"])
    print("(a') a no-op Faust agent over the same topic ...")
    floor = bench_faust_floor(env, len(payloads), actions, args.port + 5, "agent")
    print("(a'') a no-op BatchSource over the same topic ...")
    batch_floor = bench_faust_floor(env, len(payloads), actions, args.port + 6, "batch")
    return {
        "faust_floor_rate": floor,
        "batch_floor_rate": batch_floor,
        "accumulate_rate": actions / (t_accumulated - start),
        "end_to_end_rate": actions / (t_applied - start),
        "cpu_us_per_action": [pipeline_cpu * 1e6 / actions, sink_cpu * 1e6 / actions],
        "rss_pipeline_mb": rss[0],
        "rss_sink_mb": rss[1],
        "changelog_bytes_per_action": cl_bytes / actions,
    }


async def bench_latency(args: argparse.Namespace) -> dict[str, float]:
    tag = uuid.uuid4().hex[:6]
    run_dir = ROOT / ".bench" / f"lat-{tag}"
    run_dir.mkdir(parents=True)
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "AC_APP_ID": f"benchlat-{tag}",
        "AC_TOPIC_PREFIX": f"benchlat-{tag}.",
        "AC_PARTITIONS": str(args.partitions),
        "AC_DATA_DIR": str(run_dir / "state"),
        "AC_THRESHOLD": str(args.threshold),
        "AC_LLM_CALLABLE": "scripts.bench_plugins:instant",
        "AC_STORE": args.store,
    }
    settings = settings_of(args, env)
    await ensure_topics(settings)
    seconds, warmup_s = args.latency_seconds, 5.0
    payloads = workload(
        int(args.rate * (seconds + warmup_s)), 500, seed=args.seed + 1, min_batch=1, max_batch=3
    )
    # The first seconds after start-up (first fetches, metadata, group settling)
    # are not steady state: histograms are snapshotted after a warm-up and the
    # figures are the difference.
    per_second = len(payloads) / (seconds + warmup_s)
    warmup, measured = (
        payloads[: int(per_second * warmup_s)],
        payloads[int(per_second * warmup_s) :],
    )
    workers = Workers(env, run_dir, args.port + 10)
    sink_port = args.port + 11
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("agents.app", "pipeline", args.port + 10)
            workers.start("sinks.app", "sink-null", sink_port, AC_SINK="null")
            await wait_healthy(client, [args.port + 10, sink_port])
            topic = settings.topic("actions")

            async def offer(part: list[dict[str, Any]], applied: int, label: str) -> str:
                """Offer ``part`` at the rate, wait until the sink applied ``applied``, scrape."""
                await produce(args.bootstrap, topic, part, rate=per_second)
                await wait_metric(
                    client,
                    sink_port,
                    "ac_sink_operations_total",
                    applied,
                    label,
                    op="actions_written",
                )
                return await scrape(client, sink_port)

            print(f"  warm-up: {args.rate:,.0f} actions/s for {warmup_s:.0f}s ...")
            before = await offer(warmup, len(warmup), "warm-up batches")
            pipeline_before = await scrape(client, args.port + 10)
            print(f"  offering {args.rate:,.0f} actions/s for {seconds:.0f}s ...")
            start, cpu_start = time.perf_counter(), workers.cpu_seconds()
            after = await offer(measured, len(payloads), "batches applied")
            wall = time.perf_counter() - start
            cpu = [end - begin for end, begin in zip(workers.cpu_seconds(), cpu_start, strict=True)]
            pipeline_after = await scrape(client, args.port + 10)
    finally:
        workers.stop()
    latency = histogram_quantiles(after, "ac_action_age_at_sink_seconds", before)
    # Each worker's share of a core in steady state: what a change saves shows here
    # long before it shows in the latency (docs/performance.md, session 7).
    latency.update(pipeline_core=cpu[0] / wall, sink_core=cpu[1] / wall)
    sink_part = histogram_quantiles(after, "ac_end_to_end_seconds", before)
    latency.update(sink_p50_le_s=sink_part["p50_le_s"], sink_p99_le_s=sink_part["p99_le_s"])
    latency.update(stalls("pipeline", pipeline_after, pipeline_before))
    latency.update(stalls("sink", after, before))
    return latency


def stalls(worker: str, text: str, since: str) -> dict[str, float]:
    """A worker's event-loop stalls and GC pauses over the measured part (streams.observe.stalls)."""
    found = {}
    for key, name, labels in (
        ("loop", "ac_event_loop_lag_seconds", ""),
        ("gc1", "ac_gc_pause_seconds", 'generation="1"'),
        ("gc2", "ac_gc_pause_seconds", 'generation="2"'),
    ):
        buckets = bucket_deltas(text, name, since, labels)
        total = buckets[-1][1] if buckets else 0.0
        below = dict(buckets)
        found[f"{worker}_{key}_over_25ms"] = total - below.get(0.025, total)
        found[f"{worker}_{key}_max_le_s"] = next(
            (bound for bound, count in buckets if total and count >= total), 0.0
        )
    return found


def bucket_counts(text: str, name: str, labels: str = "") -> dict[float, float]:
    counts: dict[float, float] = {}
    for line in text.splitlines():
        if line.startswith(f"{name}_bucket") and labels in line:
            le = re.search(r'le="([^"]+)"', line)
            if le:
                counts[float(le.group(1))] = float(line.rsplit(" ", 1)[1])
    return counts


def bucket_deltas(text: str, name: str, since: str, labels: str = "") -> list[tuple[float, float]]:
    """A histogram's cumulative bucket counts, less those of an earlier scrape, by bound."""
    earlier = bucket_counts(since, name, labels)
    return sorted(
        (bound, count - earlier.get(bound, 0.0))
        for bound, count in bucket_counts(text, name, labels).items()
    )


def histogram_quantiles(text: str, name: str, since: str = "") -> dict[str, float]:
    """p50/p99 as bucket upper bounds, of the observations made after ``since`` (a scrape)."""
    buckets = bucket_deltas(text, name, since)
    total = buckets[-1][1] if buckets else 0

    def quantile(q: float) -> float:
        for bound, count in buckets:
            if count >= q * total:
                return bound
        return float("nan")

    return {"p50_le_s": quantile(0.5), "p99_le_s": quantile(0.99), "samples": total}


async def bench_summarizer(args: argparse.Namespace) -> float:
    tag = uuid.uuid4().hex[:6]
    run_dir = ROOT / ".bench" / f"sum-{tag}"
    run_dir.mkdir(parents=True)
    sessions, threshold = 2000, args.threshold
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "AC_APP_ID": f"benchsum-{tag}",
        "AC_TOPIC_PREFIX": f"benchsum-{tag}.",
        "AC_PARTITIONS": str(args.partitions),
        "AC_DATA_DIR": str(run_dir / "state"),
        "AC_THRESHOLD": str(threshold),
        "AC_LLM_CALLABLE": "scripts.bench_plugins:slow_500ms",
        "AC_LLM_CONCURRENCY": str(args.llm_concurrency),
        "AC_IDLE_TIMEOUT_S": "3600",
    }
    settings = settings_of(args, env)
    await ensure_topics(settings)
    payloads = workload(
        sessions * threshold * 2,
        sessions,
        seed=args.seed + 2,
        min_batch=threshold,
        max_batch=threshold,
    )
    await produce(args.bootstrap, settings.topic("actions"), payloads)
    summaries = len(payloads)  # one batch of K actions -> one summary
    workers = Workers(env, run_dir, args.port + 20)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("agents.app", "pipeline", args.port + 20)
            await wait_metric(client, args.port + 20, "ac_summaries_total", 1, "first summary")
            start = time.perf_counter()
            done = await wait_metric(
                client, args.port + 20, "ac_summaries_total", summaries, "summaries"
            )
    finally:
        workers.stop()
    return (summaries - 1) / (done - start)


MEMORY_MARKS = (0.1, 0.25, 0.5, 0.75, 1.0)


async def bench_memory(args: argparse.Namespace) -> dict[str, list[tuple[int, float]]]:
    """RSS of the pipeline worker as it takes on idle sessions, per table store."""
    tag = uuid.uuid4().hex[:6]
    prefix = f"benchmem-{tag}."
    settings = Settings(
        kafka_bootstrap_servers=args.bootstrap, topic_prefix=prefix, partitions=args.partitions
    )
    await ensure_topics(settings)
    payloads = idle_sessions(args.sessions, seed=args.seed + 3)
    print(f"  producing {len(payloads):,} payloads: {args.sessions:,} sessions of 2 actions ...")
    await produce(args.bootstrap, settings.topic("actions"), payloads)
    actions = sum(len(p["actions"]) for p in payloads)
    results: dict[str, list[tuple[int, float]]] = {}
    for n, store in enumerate(args.stores.split(",")):
        run_dir = ROOT / ".bench" / f"mem-{tag}-{n}"
        run_dir.mkdir(parents=True)
        env = {
            "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
            "AC_APP_ID": f"benchmem-{tag}-{n}",  # its own group and tables, the same input
            "AC_TOPIC_PREFIX": prefix,
            "AC_PARTITIONS": str(args.partitions),
            "AC_DATA_DIR": str(run_dir / "state"),
            "AC_THRESHOLD": str(args.threshold),
            "AC_LLM_CALLABLE": "scripts.bench_plugins:instant",
            "AC_STORE": store,
            "AC_IDLE_TIMEOUT_S": "86400",  # idle, but kept: the point is holding them
        }
        workers = Workers(env, run_dir, args.port + 30)
        marks: list[tuple[int, float]] = []
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                workers.start("agents.app", "pipeline", args.port + 30)
                for mark in MEMORY_MARKS:
                    await wait_metric(
                        client,
                        args.port + 30,
                        "ac_actions_in_total",
                        int(actions * mark),
                        f"{store} actions in",
                    )
                    marks.append((int(args.sessions * mark), workers.rss_mb()))
                    print(
                        f"  {store}: {marks[-1][0]:,} sessions held, RSS {marks[-1][1]:,.0f} MiB"
                        + rocksdb_memory(await scrape(client, args.port + 30))
                    )
        finally:
            workers.stop()
        results[store] = marks
    return results


def rocksdb_memory(text: str) -> str:
    """RocksDB's share of the worker's memory, from its gauge (empty for other stores)."""
    kinds = {
        kind: metric(text, "ac_rocksdb_memory_bytes", kind=kind) / 2**20
        for kind in ("block_cache", "memtables", "table_readers")
    }
    if not any(kinds.values()):
        return ""
    return " (RocksDB: " + ", ".join(f"{k} {v:,.0f}" for k, v in kinds.items()) + " MiB)"


def print_memory(results: dict[str, list[tuple[int, float]]]) -> None:
    stores = list(results)
    print(f"\n{'sessions held':>14} " + " ".join(f"{s + ' RSS MiB':>18}" for s in stores))
    for i, (sessions, _) in enumerate(results[stores[0]]):
        print(f"{sessions:>14,} " + " ".join(f"{results[s][i][1]:>18,.0f}" for s in stores))
    for store, marks in results.items():
        (s0, r0), (s1, r1) = marks[1], marks[-1]  # from 25%: past start-up allocations
        print(f"{store}: +{(r1 - r0) / (s1 - s0) * 100_000:,.0f} MiB per 100,000 sessions")


async def bench_topics(bootstrap: str) -> set[str]:
    """The broker's topics of benchmark runs (theirs and their tables' changelogs)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        return {t for t in await admin.list_topics() if t.startswith("bench")}
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, topics: set[str]) -> None:
    """Found with a broker that had kept every run's topics (12,000 partitions, 28 GB):
    it spent a core on its own upkeep, and the latency at 5,000 actions/s went from
    p99 <= 100 ms on a fresh broker to p99 <= 1 s. A run leaves nothing behind."""
    if not topics:
        return
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(sorted(topics))
    finally:
        await admin.close()
    print(f"deleted this run's {len(topics)} topics")


async def main_async(args: argparse.Namespace) -> None:
    before = await bench_topics(args.bootstrap)
    try:
        await run_mode(args)
    finally:
        if not args.keep_topics:
            await delete_topics(args.bootstrap, await bench_topics(args.bootstrap) - before)


def print_latency_run(args: argparse.Namespace, latency: dict[str, float]) -> None:
    print(
        f"latency at {args.rate:,.0f} actions/s offered: p50 <= "
        f"{latency['p50_le_s'] * 1000:.0f} ms, p99 <= {latency['p99_le_s'] * 1000:.0f} ms "
        f"(of which emitted -> sink: p50 <= {latency['sink_p50_le_s'] * 1000:.0f} ms, "
        f"p99 <= {latency['sink_p99_le_s'] * 1000:.0f} ms); CPU: pipeline "
        f"{latency['pipeline_core']:.0%}, sink {latency['sink_core']:.0%} of a core",
        flush=True,
    )
    for worker in ("pipeline", "sink"):
        print(
            f"  {worker}: event loop late > 25 ms {latency[f'{worker}_loop_over_25ms']:.0f} times"
            f" (worst <= {latency[f'{worker}_loop_max_le_s'] * 1000:.0f} ms); GC pauses"
            f" > 25 ms: gen 1 {latency[f'{worker}_gc1_over_25ms']:.0f}, gen 2"
            f" {latency[f'{worker}_gc2_over_25ms']:.0f} (worst <= "
            f"{latency[f'{worker}_gc1_max_le_s'] * 1000:.0f} /"
            f" {latency[f'{worker}_gc2_max_le_s'] * 1000:.0f} ms)",
            flush=True,
        )


def print_latency_summary(runs: list[dict[str, float]]) -> None:
    """How many runs met the issue's target (p99 under 100 ms). Runs of the same code
    differ more than most changes measured here (the two cores are shared by the
    workers, the broker and the load generator), so one run proves little."""
    under = sum(1 for latency in runs if latency["p99_le_s"] < 0.1)
    bounds = ", ".join(f"{latency['p99_le_s'] * 1000:.0f}" for latency in runs)
    print(f"p99 bounds (ms): {bounds}; under 100 ms in {under} of {len(runs)} runs")


def print_accumulate_run(sdk_rate: float, transition_rate: float, ours: dict[str, float]) -> None:
    cpu = ours["cpu_us_per_action"]
    print(
        f"accumulate alone: {ours['rate']:,.0f} actions/s, {cpu:.0f} us "
        f"of CPU per action; in-process SDK {sdk_rate:,.0f} actions/s "
        f"({1e6 / sdk_rate:.0f} us); c/b (accumulate only) = {ours['rate'] / sdk_rate:.2f}\n"
        f"  of the worker's {cpu:.0f} us, the transition itself is {1e6 / transition_rate:.0f}; "
        f"the other {cpu - 1e6 / transition_rate:.0f} are the Kafka clients, the write-behind "
        f"and the summarize agent; the worker's peak RSS {ours['rss_mb']:,.0f} MiB",
        flush=True,
    )


async def run_mode(args: argparse.Namespace) -> None:
    if args.mode == "memory":
        print_memory(await bench_memory(args))
        return
    if args.mode == "summarizer":
        rate = await bench_summarizer(args)
        print(
            f"summarizer: {rate:,.0f} summaries/s with a 500 ms LLM "
            f"(concurrency {args.llm_concurrency}, 2,000 sessions)"
        )
        return
    if args.mode == "latency":
        runs = []
        for _ in range(args.repeat):
            runs.append(await bench_latency(args))
            print_latency_run(args, runs[-1])
        if len(runs) > 1:
            print_latency_summary(runs)
        return
    payloads = workload(
        args.actions, args.sessions, args.seed, min_batch=1, max_batch=args.max_batch
    )
    actions = sum(len(p["actions"]) for p in payloads)
    raw = [orjson.dumps(p) for p in payloads]
    print(
        f"workload: {actions:,} actions, {args.sessions:,} sessions, {len(payloads):,} payloads "
        f"(1-{args.max_batch} actions each), K={args.threshold}, {args.partitions} partitions"
    )
    if args.mode == "accumulate":
        # The SDK once, first: measured again in this process after a run, it was
        # a third slower each time (20,000-23,000 against 33,000 actions/s).
        sdk_rate = await bench_sdk(raw, actions, args.threshold)
        transition_rate = bench_transition(raw, actions, args.threshold)
        print(
            f"our transition alone (no Kafka, no summarizer): {transition_rate:,.0f} actions/s "
            f"({1e6 / transition_rate:.0f} us per action)"
        )
        for _ in range(args.repeat):
            ours = await bench_accumulate(args, payloads, actions)
            print_accumulate_run(sdk_rate, transition_rate, ours)
        return
    print("(b) in-process autoplay_sdk writer + summarizer ...")
    sdk_rate = await bench_sdk(raw, actions, args.threshold)
    print("(c) our pipeline end to end ...")
    ours = await bench_pipeline(args, payloads, actions)
    print("(a) raw aiokafka consumption of the same topic ...")
    tag_topic = None
    # (a) reads the topic (c) consumed; find it by prefix from the last run dir
    for path in sorted((ROOT / ".bench").glob("*/pipeline.log"), key=lambda p: p.stat().st_mtime):
        tag_topic = f"bench-{path.parent.name}.actions"
    raw_rate = await bench_raw_consumer(args.bootstrap, tag_topic or "", len(payloads), actions)
    print("latency at a fixed offered rate ...")
    latency = await bench_latency(args)
    print()
    print(f"{'(a) raw aiokafka consumer':<44} {raw_rate:>12,.0f} actions/s")
    print(
        f"{chr(40) + 'a' + chr(39) + ') no-op Faust agent (framework floor)':<44} "
        f"{ours['faust_floor_rate']:>12,.0f} actions/s"
    )
    print(
        f"{chr(40) + 'a' + chr(39) * 2 + ') no-op BatchSource (our delivery floor)':<44} "
        f"{ours['batch_floor_rate']:>12,.0f} actions/s"
    )
    print(f"{'(b) in-process SDK (no durability)':<44} {sdk_rate:>12,.0f} actions/s")
    print(
        f"{'(c) pipeline: accumulate (inputs durable)':<44} {ours['accumulate_rate']:>12,.0f} actions/s"
    )
    print(
        f"{'(c) pipeline: end to end at the null sink':<44} {ours['end_to_end_rate']:>12,.0f} actions/s"
    )
    print(
        f"c/a = {ours['end_to_end_rate'] / raw_rate:.2f}   c/b = {ours['end_to_end_rate'] / sdk_rate:.2f}"
        f"   (accumulate only: c/b = {ours['accumulate_rate'] / sdk_rate:.2f})"
    )
    print(
        f"c/a' = {ours['end_to_end_rate'] / ours['faust_floor_rate']:.2f}   "
        f"a'/b = {ours['faust_floor_rate'] / sdk_rate:.2f}   "
        "(what Faust's delivery alone allows against the SDK)"
    )
    print(
        f"c/a'' = {ours['end_to_end_rate'] / ours['batch_floor_rate']:.2f}   "
        f"a''/b = {ours['batch_floor_rate'] / sdk_rate:.2f}   "
        "(the same for our batch delivery)"
    )
    print(
        f"latency at {args.rate:,.0f} actions/s offered: p50 <= {latency['p50_le_s'] * 1000:.0f} ms, "
        f"p99 <= {latency['p99_le_s'] * 1000:.0f} ms ({latency['samples']:,.0f} batches; "
        f"histogram bucket bounds); CPU meanwhile: pipeline {latency['pipeline_core']:.0%}, "
        f"sink {latency['sink_core']:.0%} of a core"
    )
    print(
        f"peak RSS: pipeline {ours['rss_pipeline_mb']:.0f} MiB, sink {ours['rss_sink_mb']:.0f} MiB; "
        f"bench process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    print(f"changelog bytes per action: {ours['changelog_bytes_per_action']:.0f}")
    pipeline_cpu, sink_cpu = ours["cpu_us_per_action"]
    print(
        f"CPU per action: pipeline {pipeline_cpu:.0f} us, null sink "
        f"{sink_cpu:.0f} us; in-process SDK {1e6 / sdk_rate:.0f} us (wall time, one core)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--mode",
        choices=["throughput", "accumulate", "summarizer", "latency", "memory"],
        default="throughput",
    )
    parser.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")
    )
    parser.add_argument("--actions", type=int, default=200_000)
    parser.add_argument("--sessions", type=int, default=5_000)
    parser.add_argument("--max-batch", type=int, default=3)
    parser.add_argument("--threshold", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--store", default="memory://")
    parser.add_argument(
        "--stores", default="memory://,rocksdb://", help="--mode memory: the stores to compare"
    )
    parser.add_argument("--rate", type=float, default=5_000)
    parser.add_argument("--latency-seconds", type=float, default=20)
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="--mode latency or accumulate: runs, each on fresh topics",
    )
    parser.add_argument("--llm-concurrency", type=int, default=256)
    parser.add_argument("--port", type=int, default=6100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--keep-topics", action="store_true", help="leave the run's topics on the broker"
    )
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
