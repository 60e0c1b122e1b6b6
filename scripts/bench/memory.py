"""`--mode memory`: RSS of the pipeline worker as it takes on idle sessions, per table store."""

from __future__ import annotations

import argparse

import httpx

from scripts.bench.measure import ROOT, Workers, metric, new_tag, scrape, wait_metric, worker_env
from scripts.bench.workload import idle_sessions, produce
from streams.settings import Settings
from streams.topics import ensure_topics

MEMORY_MARKS = (0.1, 0.25, 0.5, 0.75, 1.0)


async def bench_memory(args: argparse.Namespace) -> dict[str, list[tuple[int, float]]]:
    """RSS of the pipeline worker as it takes on idle sessions, per table store."""
    tag = new_tag()
    prefix = f"perfmem-{tag}."
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
        env = worker_env(
            args,
            f"perfmem-{tag}-{n}",  # its own group and tables, the same input
            run_dir,
            AC_TOPIC_PREFIX=prefix,
            AC_STORE=store,
            AC_IDLE_TIMEOUT_S="86400",  # idle, but kept: the point is holding them
        )
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


async def run_memory(args: argparse.Namespace) -> None:
    print_memory(await bench_memory(args))
