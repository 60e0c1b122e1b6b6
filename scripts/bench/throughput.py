"""(c): the pipeline on a backlog, accumulate alone (`--mode accumulate`) and end to end."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import httpx

from agents.accumulate.compiled import compiled_for
from agents.accumulate.state import Limits
from scripts.bench import measure
from scripts.bench.baselines import bench_faust_floor, bench_sdk, bench_transition
from scripts.bench.measure import (
    ROOT,
    Workers,
    broker_cpu_seconds,
    cpu_seconds,
    kafka_data,
    machine_shares,
    machine_ticks,
    new_run,
    settings_of,
    wait_healthy,
    wait_metric,
)
from scripts.bench.workload import backlog, changelog_records, produce_records, records_in


def changelog_bytes(bootstrap: str, app_id: str) -> float:
    """The bytes of the app's changelog segments in the broker's log directory; NaN when
    this is not the broker ``scripts/kafka.sh`` started here (another checkout's, compose's)."""
    logs = kafka_data(bootstrap) / "logs"
    if not logs.is_dir():
        return float("nan")
    return sum(path.stat().st_size for path in logs.glob(f"{app_id}-*changelog-*/*.log"))


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
    records = backlog(payloads)  # encoded before the window, as (b)'s payloads are
    print(f"  producing {len(payloads):,} payloads to {topic} ...")
    start = time.perf_counter()
    await produce_records(args.bootstrap, topic, records)
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
    args: argparse.Namespace, payloads: list[dict[str, Any]], actions: int, tree: Path = ROOT
) -> dict[str, float]:
    """The pipeline worker alone on a backlog: actions/s and CPU per action, from the
    backlog's first record to ``accumulator_done``; the worker run from ``tree``."""
    env, run_dir = await new_run(args)
    workers = Workers(env, run_dir, args.port, tree=tree)
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("agents.app", "pipeline", args.port)
            await wait_healthy(client, [args.port])
            cpu_start, broker_start = workers.cpu_seconds()[0], broker_cpu_seconds(args.bootstrap)
            gc_start = await measure.scrape(client, args.port)
            waited_start = await write_behind_waits(client, args.port)
            runqueue_start = workers.runqueue_seconds()[0]
            workers.profile()
            start = await offer_backlog(args, env, payloads)
            done = await accumulator_done(client, args, env["AC_TOPIC_PREFIX"], len(payloads))
            waited = await write_behind_waits(client, args.port) - waited_start
            runqueue = workers.runqueue_seconds()[0] - runqueue_start
            cpu = workers.cpu_seconds()[0] - cpu_start
            broker = broker_cpu_seconds(args.bootstrap) - broker_start
            rss = workers.peak_rss_mb()[0]
            gc_end = await measure.scrape(client, args.port)
            workers.stop_profiles()
    finally:
        workers.stop()
    logged = await changelog_records(args.bootstrap, env["AC_APP_ID"])
    gc_seconds, gc_passes = (
        measure.metric(gc_end, name) - measure.metric(gc_start, name)
        for name in ("ac_gc_pause_seconds_sum", "ac_gc_pause_seconds_count")
    )
    return {
        "rate": actions / (done - start),
        "cpu_us_per_action": cpu * 1e6 / actions,
        "rss_mb": rss,
        "changelog_records_per_action": logged / actions,
        "broker_cpu_us_per_action": broker * 1e6 / actions,
        "gc_share": gc_seconds / cpu if cpu else 0.0,
        "gc_passes": gc_passes,
        "core_share": cpu / (done - start),
        "runqueue_share": runqueue / (done - start),
        "waited_share": waited / (done - start),
    }


async def write_behind_waits(client: httpx.AsyncClient, port: int) -> float:
    """The seconds the pipeline's accumulator has waited so far to seal a unit, its
    write-behind full (``ac_write_behind_wait_seconds_total``)."""
    return measure.metric(
        await measure.scrape(client, port), "ac_write_behind_wait_seconds_total", stage="accumulate"
    )


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
            broker_start, machine_start = broker_cpu_seconds(args.bootstrap), machine_ticks()
            waited_start = await write_behind_waits(client, args.port)
            runqueue_start, bench_start = workers.runqueue_seconds(), cpu_seconds(os.getpid())
            workers.profile()
            start = await offer_backlog(args, env, payloads)
            t_accumulated = await accumulator_done(
                client, args, env["AC_TOPIC_PREFIX"], len(payloads)
            )
            # Who held the cores through accumulate's window, and how long the accumulator
            # waited for the broker's acknowledgements (docs/performance.md, "What bounds c").
            window = t_accumulated - start
            waited = await write_behind_waits(client, args.port) - waited_start
            cpu_window, runqueue = workers.cpu_seconds(), workers.runqueue_seconds()
            shares = {
                "pipeline_core": (cpu_window[0] - cpu_start[0]) / window,
                "pipeline_runqueue": (runqueue[0] - runqueue_start[0]) / window,
                "bench_core": (cpu_seconds(os.getpid()) - bench_start) / window,
                "sink_core": (cpu_window[1] - cpu_start[1]) / window,
                "broker_core": (broker_cpu_seconds(args.bootstrap) - broker_start) / window,
                **machine_shares(machine_start, machine_ticks()),
                "accumulate_waited": waited / window,
            }
            pipeline_cpu = cpu_window[0] - cpu_start[0]
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
            workers.stop_profiles()
    finally:
        workers.stop()
    cl_bytes = changelog_bytes(args.bootstrap, env["AC_APP_ID"])
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
        "actions_topic": env["AC_TOPIC_PREFIX"] + "actions",
        "window": shares,
    }


def print_accumulate_run(sdk_rate: float, transition_rate: float, ours: dict[str, float]) -> None:
    cpu = ours["cpu_us_per_action"]
    print(
        f"accumulate alone: {ours['rate']:,.0f} actions/s, {cpu:.0f} us "
        f"of CPU per action; in-process SDK {sdk_rate:,.0f} actions/s "
        f"({1e6 / sdk_rate:.0f} us); c/b (accumulate only) = {ours['rate'] / sdk_rate:.2f}\n"
        f"  of the worker's {cpu:.0f} us, the transition itself is {1e6 / transition_rate:.0f} "
        f"(as the worker runs it); "
        f"the other {cpu - 1e6 / transition_rate:.0f} are the Kafka clients, the write-behind "
        f"and the summarize agent; the worker's peak RSS {ours['rss_mb']:,.0f} MiB; "
        f"{ours['changelog_records_per_action']:.2f} changelog records per action; the broker "
        f"{ours['broker_cpu_us_per_action']:.0f} us of CPU per action (the producer's included); "
        f"cyclic GC {ours['gc_share']:.1%} of the worker's CPU ({ours['gc_passes']:.0f} passes); "
        f"the worker at {ours['core_share']:.2f} of a core and waiting for one "
        f"{ours['runqueue_share']:.2f}, its accumulator waiting for acknowledgements "
        f"{ours['waited_share']:.0%} of the window",
        flush=True,
    )


async def run_accumulate(
    args: argparse.Namespace, payloads: list[dict[str, Any]], raw: list[bytes], actions: int
) -> None:
    """``--mode accumulate``: the pipeline worker alone, beside (b) and our transition alone."""
    # The SDK once, first: measured again in this process after a run, it was
    # a third slower each time (20,000-23,000 against 33,000 actions/s).
    sdk_rate, _ = await bench_sdk(raw, actions, args.threshold)
    python_rate = bench_transition(raw, actions, args.threshold, compiled=False)
    built = compiled_for(Limits(threshold=args.threshold, max_actions_per_batch=1))
    transition_rate = (
        bench_transition(raw, actions, args.threshold, compiled=True) if built else python_rate
    )
    print(
        f"our transition alone (no Kafka, no summarizer): {transition_rate:,.0f} actions/s "
        f"({1e6 / transition_rate:.1f} us per action, "
        + (f"compiled; in Python {1e6 / python_rate:.1f})" if built else "in Python: not compiled)")
    )
    for _ in range(args.repeat):
        for loop in args.event_loop.split(","):  # alternated: runs minutes apart differ more
            for tree in args.tree:
                measure.LOOP = loop
                ours = await bench_accumulate(args, payloads, actions, tree)
                print(f"event loop: {loop}" + (f"; tree {tree}" if len(args.tree) > 1 else ""))
                print_accumulate_run(sdk_rate, transition_rate, ours)
