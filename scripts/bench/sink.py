"""``--mode sink``: one sink worker alone (null, or ``--sink``) over a fixed set of context operations.

The operations are what the pipeline emits for the workload: the accumulator's own
``actions_written`` records (``agents.accumulate.state.apply_payload``) and, for each
summarize request it makes (every K actions), the ``summary_ready`` an instant LLM
answers with. They are produced to a fresh ``context`` topic while the worker runs;
its CPU from the first record to the last operation applied is divided by the actions.
``--tree A,B`` runs the worker from each checkout in turn (alternated each repeat), so
an older tree's sink is measured on the same operations by this tree's benchmark.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import httpx
import orjson

from scripts.bench.baselines import bench_sdk
from scripts.bench.measure import (
    Workers,
    metric,
    new_run,
    scrape,
    settings_of,
    wait_healthy,
    wait_metric,
)
from scripts.bench.throughput import changelog_bytes
from scripts.bench.workload import changelog_records, produce_records


def operations(
    payloads: list[dict[str, Any]], threshold: int
) -> tuple[list[tuple[bytes, bytes]], int, int]:
    """The context operations for ``payloads`` (key, value), in the pipeline's order per
    session; with how many are ``actions_written`` and how many ``summary_ready``."""
    from agents.accumulate.state import Limits, MemoryBatchStore, apply_payload
    from agents.summarize.state import SummaryState, count_facts
    from schemas import SummarizeRequest, SummaryReady, decode, encode
    from schemas.fast import decode_payload
    from schemas.ledger import LedgerLimits
    from streams.settings import Settings

    limits = Limits(threshold=threshold, max_actions_per_batch=Settings().max_actions_per_batch)
    store, states, out, written, summaries = MemoryBatchStore(), dict[str, Any](), [], 0, 0
    facts: dict[str, SummaryState] = {}  # the summarize stage's ledgers
    for offset, data in enumerate(payloads):
        payload = decode_payload(orjson.dumps(data))
        state, emitted = apply_payload(
            states.get(payload.session_id), payload, offset, limits, store=store
        )
        states[payload.session_id] = state
        key = payload.session_id.encode()
        for emission in emitted:
            if emission.topic == "context":
                out.append((key, emission.value))
                written += 1
                continue
            request = decode(SummarizeRequest, emission.value)
            fact = facts.setdefault(request.session_id, SummaryState(generation=0))
            count_facts(fact, request, LedgerLimits())
            summary = SummaryReady(
                session_id=request.session_id,
                product_id=request.product_id,
                generation=request.generation,
                seq_from=1,
                seq_to=request.seq_to,
                window_from=request.seq_from,
                summary=f"The user worked through actions 1-{request.seq_to}.",
                emitted_at=time.time(),
                ledger=fact.ledger,  # validated by the model
                summarized_in_s=0.0,
            )
            out.append((key, encode(summary)))
            summaries += 1
    return out, written, summaries


async def bench_sink_once(
    args: argparse.Namespace,
    records: list[tuple[bytes, bytes]],
    written: int,
    summaries: int,
    tree: Path,
) -> dict[str, float]:
    env, run_dir = await new_run(args)
    workers = Workers(env, run_dir, args.port, tree=tree)
    port = args.port + 1
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            workers.start("sinks.app", f"sink-{args.sink}", port, AC_SINK=args.sink)
            await wait_healthy(client, [port])
            cpu_start = workers.cpu_seconds()[0]
            workers.profile()
            topic = settings_of(args, env).topic("context")
            print(f"  producing {len(records):,} operations to {topic} ...")
            start = time.perf_counter()
            await produce_records(args.bootstrap, topic, records)
            total = "ac_sink_operations_total"
            await wait_metric(client, port, total, written, "batches", op="actions_written")
            done = await wait_metric(
                client, port, total, summaries, "summaries", op="summary_ready"
            )
            cpu = workers.cpu_seconds()[0] - cpu_start
            workers.stop_profiles()
            # The cache's misses (AC_SINK_CONTEXT_CACHE): 0 while the sessions fit in it.
            decoded = metric(await scrape(client, port), "ac_sink_contexts_decoded_total")
    finally:
        workers.stop()
    logged = await changelog_records(args.bootstrap, env["AC_APP_ID"])
    return {
        "rate": args.actions_total / (done - start),
        "cpu": cpu * 1e6 / args.actions_total,
        "logged": logged / len(records),
        "bytes": changelog_bytes(args.bootstrap, env["AC_APP_ID"]) / len(records),
        "decoded": decoded / len(records),
    }


async def run_sink(args: argparse.Namespace, payloads: list[dict[str, Any]], actions: int) -> None:
    # (b) in this process first, for the target's ratio (null sink <= half the SDK's CPU).
    _, sdk_cpu = await bench_sdk([orjson.dumps(p) for p in payloads], actions, args.threshold)
    print(f"  in-process SDK: {sdk_cpu:.1f} us of CPU per action")
    records, written, summaries = operations(payloads, args.threshold)
    args.actions_total = actions
    print(f"  {written:,} actions_written and {summaries:,} summary_ready operations")
    for _ in range(args.repeat):
        for tree in args.tree:  # alternated: runs minutes apart differ more than trees do
            found = await bench_sink_once(args, records, written, summaries, tree)
            print(
                f"{args.sink} sink from {tree}: {found['rate']:,.0f} actions/s, "
                f"{found['cpu']:.1f} us of CPU per action ({found['cpu'] / sdk_cpu:.2f}x the SDK's), "
                f"{found['logged']:.2f} changelog records ({found['bytes']:,.0f} bytes) per operation, "
                f"{found['decoded']:.2f} contexts decoded from the table per operation",
                flush=True,
            )
