"""`--mode summarizer`: 2,000 sessions, an LLM that takes 500 ms: summaries per second."""

from __future__ import annotations

import argparse
import time

import httpx

from scripts.bench.measure import ROOT, Workers, new_tag, settings_of, wait_metric, worker_env
from scripts.bench.workload import produce, workload
from streams.topics import ensure_topics


async def bench_summarizer(args: argparse.Namespace) -> float:
    tag = new_tag()
    run_dir = ROOT / ".bench" / f"sum-{tag}"
    run_dir.mkdir(parents=True)
    sessions, threshold = 2000, args.threshold
    env = worker_env(
        args,
        f"perfsum-{tag}",
        run_dir,
        AC_LLM_CALLABLE="scripts.bench.plugins:slow_500ms",
        AC_LLM_CONCURRENCY=str(args.llm_concurrency),
    )
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


async def run_summarizer(args: argparse.Namespace) -> None:
    rate = await bench_summarizer(args)
    print(
        f"summarizer: {rate:,.0f} summaries/s with a 500 ms LLM "
        f"(concurrency {args.llm_concurrency}, 2,000 sessions)"
    )
