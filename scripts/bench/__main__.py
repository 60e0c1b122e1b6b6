"""Benchmark: what durability costs, on one workload, in one run (`python -m scripts.bench`).

  (a) raw aiokafka consumption of the `actions` topic (the ceiling for a Python consumer)
  (b) the in-process autoplay_sdk AsyncAgentContextWriter + AsyncSessionSummarizer (no Kafka)
  (c) our pipeline end to end: actions -> tables -> context -> a null sink, instant LLM
  (d) the same job written with Quix Streams, on the same workload and broker
  latency: p50/p99 from produce to application at the sink, at a fixed offered rate
  The default mode ends with one line for scripts:
  RATIOS c/b=<x> c/d=<y> cpu_pipeline/sdk=<z> cpu_sink/sdk=<w>
  [--repeat N]: N runs, each target met in how many, and the medians' RATIOS line last
  --mode latency [--repeat N]: only the latency; with N runs, how many met p99 < 100 ms
  --mode summarizer: 2,000 sessions, an LLM that takes 500 ms: summaries per second
  --mode accumulate: the pipeline worker alone on a backlog, to durable and summarised,
    beside (b) and our accumulator's transition alone in this process (what the rest costs)
  --mode sink [--tree OLD,NEW]: a null sink worker alone over the pipeline's operations
    for the workload, from each checkout in turn: its CPU per action
  --mode memory: RSS of the pipeline worker as it takes on idle sessions, per store

Prints figures and ratios; it is not a test. Needs the broker (make broker).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # also as `python scripts/bench`

import orjson

from scripts.bench import measure
from scripts.bench.default import run_default, summary
from scripts.bench.latency import run_latency
from scripts.bench.memory import run_memory
from scripts.bench.sink import run_sink
from scripts.bench.summarizer import run_summarizer
from scripts.bench.throughput import run_accumulate
from scripts.bench.workload import bench_parser, workload


async def main_async(args: argparse.Namespace) -> None:
    try:
        await run_mode(args)
    finally:
        if not args.keep_topics:
            await measure.delete_run_topics(args.bootstrap)


async def run_mode(args: argparse.Namespace) -> None:
    if args.mode == "memory":
        return await run_memory(args)
    if args.mode == "summarizer":
        return await run_summarizer(args)
    if args.mode == "latency":
        return await run_latency(args)
    payloads = workload(
        args.actions, args.sessions, args.seed, min_batch=1, max_batch=args.max_batch, ids=args.ids
    )
    actions = sum(len(p["actions"]) for p in payloads)
    raw = [orjson.dumps(p) for p in payloads]
    print(
        f"workload: {actions:,} actions, {args.sessions:,} sessions, {len(payloads):,} payloads "
        f"(1-{args.max_batch} actions each), K={args.threshold}, {args.partitions} partitions"
        + (", URLs and descriptions with ids" if args.ids else "")
    )
    if args.mode == "accumulate":
        return await run_accumulate(args, payloads, raw, actions)
    if args.mode == "sink":
        return await run_sink(args, payloads, actions)
    runs = [await run_default(args, payloads, raw, actions) for _ in range(args.repeat)]
    if len(runs) > 1:
        print("\n".join(summary(runs)))


def loops(value: str) -> str:
    if unknown := set(value.split(",")) - {"aio", "uvloop"}:
        raise argparse.ArgumentTypeError(f"unknown event loop {', '.join(sorted(unknown))}")
    return value


def trees(value: str) -> list[Path]:
    return [Path(tree).resolve() for tree in value.split(",")]


def parser() -> argparse.ArgumentParser:
    parse = bench_parser("python -m scripts.bench", __doc__)
    add = parse.add_argument
    add("--mode", choices=["throughput", "accumulate", "sink", "summarizer", "latency", "memory"],
        default="throughput")  # fmt: skip
    add("--threshold", type=int, default=10)
    add("--store", default="memory://")
    add("--stores", default="memory://,rocksdb://", help="--mode memory: the stores to compare")
    add("--rate", type=float, default=5_000)
    add("--latency-seconds", type=float, default=20)
    add("--tick-ms", type=float, default=2,
        help="--mode latency: the load generator sends every this many ms (each action "
        "stamped with its due time, so the wait counts)")  # fmt: skip
    add("--generator", choices=["aiokafka", "rdkafka"], default="aiokafka",
        help="--mode latency: the load generator's Kafka client")  # fmt: skip
    add("--repeat", type=int, default=1,
        help="the default mode, --mode latency, accumulate or sink: runs, each on fresh "
        "topics; the default mode then prints each target met in how many runs and the "
        "medians' RATIOS line")  # fmt: skip
    add("--sink", default="null", help="--mode sink: the sink (AC_SINK) to run")
    add("--tree", type=trees, default=[Path(__file__).resolve().parents[2]],
        help="--mode sink or accumulate: checkouts to run the worker from, alternated (A,B)")  # fmt: skip
    add("--llm-concurrency", type=int, default=256)
    add("--summary-chars", type=int, default=0,
        help="the stand-in LLM's summaries this long, as a real model's are (AC_SUMMARY_MAX_CHARS "
        "is 1,500); 0: a few words")  # fmt: skip
    add("--port", type=int, default=6100)
    add("--event-loop", type=loops, default="aio",
        help="the workers' event loop, aio or uvloop (Faust's F_LOOP; not --loop, which "
        "Faust takes from any command line that imports it); --mode accumulate "
        "takes a list (aio,uvloop) and alternates them each repeat")  # fmt: skip
    add("--quix-python", default="",
        help="(d): an interpreter with quixstreams (default: .bench/quix-venv, made on first use)")  # fmt: skip
    add("--profile", type=int, nargs="?", const=100, default=0, metavar="HZ",
        help="py-spy record (raw) each worker into its run directory, at HZ samples a "
        "second (100; 1000 for a backlog's fine profile, ~5%% slower while it runs)")  # fmt: skip
    add("--keep-topics", action="store_true", help="leave the run's topics on the broker")
    return parse


def main() -> None:
    args = parser().parse_args()
    measure.PROFILE = args.profile
    measure.LOOP = args.event_loop.split(",")[0]
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
