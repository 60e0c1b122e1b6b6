"""The default mode: (a)-(d) on one workload in one invocation, then latency, then RATIOS."""

from __future__ import annotations

import argparse
import math
import resource
import statistics
from typing import Any, NamedTuple

from scripts.bench.baselines import bench_raw_consumer, bench_sdk
from scripts.bench.latency import bench_latency
from scripts.bench.peer import bench_quix, quix_python, quix_python_problem
from scripts.bench.throughput import bench_pipeline


class Ratios(NamedTuple):
    """One run's ratios: the RATIOS line's four figures (c/d nan without the peer)."""

    c_b: float
    c_d: float
    cpu_pipeline_sdk: float
    cpu_sink_sdk: float

    def line(self) -> str:
        return (
            f"RATIOS c/b={self.c_b:.2f} c/d={self.c_d:.2f} "
            f"cpu_pipeline/sdk={self.cpu_pipeline_sdk:.2f} cpu_sink/sdk={self.cpu_sink_sdk:.2f}"
        )


def window_line(shares: dict[str, float]) -> str:
    """(c)'s accumulate window: each process's share of a core, how long the pipeline's
    threads waited, runnable, for one, the machine's share of its cores (2 here), and the
    share of the window the accumulator waited with its write-behind full. A wait for
    acknowledgements is not an idle worker: its other stages run meanwhile (--mode
    accumulate holds it at 0.94-0.96 of a core either way, docs/performance.md)."""
    return (
        f"  through accumulate's window: pipeline {shares['pipeline_core']:.2f} of a core "
        f"(waiting for one {shares['pipeline_runqueue']:.2f}), sink {shares['sink_core']:.2f}, "
        f"broker {shares['broker_core']:.2f}, the backlog's producer (this process) "
        f"{shares['bench_core']:.2f}; the machine {shares['machine_busy']:.0%} busy, "
        f"{shares['machine_steal']:.0%} stolen; the accumulator waited for acknowledgements "
        f"{shares['accumulate_waited']:.0%} of it"
    )


# The targets, by the RATIOS line's names: (field, name, met).
TARGETS = (
    ("c_b", "c/b >= 1.0", lambda x: x >= 1.0),
    ("c_d", "c/d >= 1.5", lambda x: x >= 1.5),
    ("cpu_pipeline_sdk", "cpu_pipeline/sdk <= 1.0", lambda x: x <= 1.0),
    ("cpu_sink_sdk", "cpu_sink/sdk <= 0.5", lambda x: x <= 0.5),
)


def summary(runs: list[Ratios]) -> list[str]:
    """``--repeat N``: each target met in how many runs, then the medians as the RATIOS
    line, last, for scripts. Runs of the same code read 0.73-0.88 for the null sink in one
    sitting (docs/performance.md): one run proves little (test_bench_measure.py)."""
    lines = []
    for field, name, met in TARGETS:
        values = [getattr(run, field) for run in runs]
        shown = ", ".join(f"{v:.2f}" for v in values)
        lines.append(f"{name}: met in {sum(map(met, values))} of {len(runs)} runs ({shown})")
    medians = [statistics.median([v for v in column if not math.isnan(v)] or [math.nan])
               for column in zip(*runs, strict=True)]  # fmt: skip
    lines.append(f"medians of {len(runs)} runs:")
    lines.append(Ratios(*medians).line())
    return lines


async def run_default(
    args: argparse.Namespace, payloads: list[dict[str, Any]], raw: list[bytes], actions: int
) -> Ratios:
    print("(b) in-process autoplay_sdk writer + summarizer ...")
    sdk_rate, sdk_cpu = await bench_sdk(raw, actions, args.threshold)
    print(f"  {sdk_rate:,.0f} actions/s, {sdk_cpu:.0f} us of CPU per action", flush=True)
    print("(c) our pipeline end to end ...")
    ours = await bench_pipeline(args, payloads, actions)
    print(  # as soon as known: a later row failing must not lose it
        f"  accumulate {ours['accumulate_rate']:,.0f} actions/s, end to end "
        f"{ours['end_to_end_rate']:,.0f}; CPU per action: pipeline "
        f"{ours['cpu_us_per_action'][0]:.0f} us, sink {ours['cpu_us_per_action'][1]:.0f} us",
        flush=True,
    )
    print(window_line(ours["window"]), flush=True)
    peer: dict[str, float] | None = None
    print("(d) the Quix Streams peer ...")
    python = quix_python(args.quix_python)
    if problem := quix_python_problem(python):
        print(f"(d) left out: {problem}")
    else:
        peer = await bench_quix(args, python, payloads, actions)
    print("(a) raw aiokafka consumption of the same topic ...")
    raw_rate = await bench_raw_consumer(
        args.bootstrap, ours["actions_topic"], len(payloads), actions
    )
    print("latency at a fixed offered rate ...")
    latency = await bench_latency(args)
    print()
    rows = [
        ("(a) raw aiokafka consumer", raw_rate),
        ("(a') no-op Faust agent (framework floor)", ours["faust_floor_rate"]),
        ("(a'') no-op BatchSource (our delivery floor)", ours["batch_floor_rate"]),
        ("(b) in-process SDK (no durability)", sdk_rate),
        ("(c) pipeline: accumulate (inputs durable)", ours["accumulate_rate"]),
        ("(c) pipeline: end to end at the null sink", ours["end_to_end_rate"]),
    ]
    if peer is not None:
        rows.append(("(d) Quix Streams peer (accumulate + summarize)", peer["rate"]))
    for label, rate in rows:
        print(f"{label:<48} {rate:>12,.0f} actions/s")
    end_to_end, accumulate = ours["end_to_end_rate"], ours["accumulate_rate"]
    print(
        f"c/a = {end_to_end / raw_rate:.2f}   c/b = {end_to_end / sdk_rate:.2f}"
        f"   (accumulate only: c/b = {accumulate / sdk_rate:.2f})"
    )
    print(
        f"c/a' = {end_to_end / ours['faust_floor_rate']:.2f}   "
        f"c/a'' = {end_to_end / ours['batch_floor_rate']:.2f}   "
        f"a'/b = {ours['faust_floor_rate'] / sdk_rate:.2f}   "
        f"a''/b = {ours['batch_floor_rate'] / sdk_rate:.2f}"
    )
    print(
        f"latency at {args.rate:,.0f} actions/s offered: p50 <= {latency['p50_le_s'] * 1000:.0f} ms, "
        f"p99 <= {latency['p99_le_s'] * 1000:.0f} ms ({latency['samples']:,.0f} batches; "
        f"histogram bucket bounds); CPU meanwhile: pipeline {latency['pipeline_core']:.0%}, "
        f"sink {latency['sink_core']:.0%} of a core"
    )
    print(
        f"peak RSS: pipeline {ours['rss_pipeline_mb']:.0f} MiB, sink {ours['rss_sink_mb']:.0f} MiB"
        + (f", Quix peer {peer['rss_mb']:.0f} MiB" if peer else "")
        + f"; bench process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB"
    )
    cl_bytes = ours["changelog_bytes_per_action"]
    print(
        f"changelog bytes per action: {cl_bytes:.0f}"
        if not math.isnan(cl_bytes)
        else "changelog bytes per action: unknown (the broker's log directory is not "
        "this checkout's .kafka-data; set KAFKA_DATA to it)"
    )
    pipeline_cpu, sink_cpu = ours["cpu_us_per_action"]
    print(
        f"CPU per action: pipeline {pipeline_cpu:.0f} us, null sink {sink_cpu:.0f} us"
        + (f", Quix peer {peer['cpu_us_per_action']:.0f} us" if peer else "")
        + f"; in-process SDK {sdk_cpu:.0f} us"
    )
    # d is the peer doing the pipeline worker's job (accumulate and summarize), so c/d
    # compares the accumulate figure with it; c/b is end to end, the stricter one.
    c_d = accumulate / peer["rate"] if peer else math.nan
    ratios = Ratios(end_to_end / sdk_rate, c_d, pipeline_cpu / sdk_cpu, sink_cpu / sdk_cpu)
    print(ratios.line(), flush=True)
    return ratios
