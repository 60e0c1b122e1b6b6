"""The Kafka clients side by side: aiokafka (our hot path) against librdkafka (confluent-kafka).

    python -m scripts.bench.clients [--repeat N] [--actions 200000] [--sessions 5000]

One workload (the bench's payloads, keyed by session, 8 partitions) on one broker, each
row alone in a fresh process (`scripts/bench/client_rows.py`), its CPU the process's
(librdkafka's threads included) per record, and its records/s:

  consume: aiokafka ``getmany`` as our BatchSource takes it, against confluent-kafka's
    ``consume(num_messages=500)`` blocking, polled by the asyncio loop, in an executor thread
  produce: our Appender (aiokafka ``create_batch``/``send_batch``), against confluent-kafka's
    ``produce`` + ``poll`` (a delivery report per record, or per partition per turn);
    both acks=all, idempotent, linger 5 ms, every acknowledgement awaited
  faust: a no-op Faust agent on Faust's own ``aiokafka://`` and ``confluent://`` drivers

With ``--rate R`` the consume rows read a fresh topic while the bench offers the workload
at R actions/s in 2 ms ticks (as ``--mode latency`` does), and the produce rows write it
at that rate in the same ticks: the client's cost at a steady rate, where each fetch or
produce request carries a few records, not a backlog's hundreds.

The rows alternate (a, b, a, b, ...) ``--repeat`` times; figures are medians. Each
includes its client's start-up, which weighs on small runs: at 10,000 records the consume
ratio read 0.81, at the default ~100,000 0.42-0.43. Ends with
one line for scripts (CPU per record, librdkafka polled by the loop over aiokafka):

  CLIENTS consume_rdkafka/aiokafka=<x> produce_rdkafka/aiokafka=<y>
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # also as a script

import orjson
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from scripts.bench import measure
from scripts.bench.workload import bench_parser, produce, workload
from streams.app import worker_command

CONSUME = ["consume-aiokafka", "consume-rdkafka", "consume-rdkafka-loop", "consume-rdkafka-thread"]
PRODUCE = ["produce-aiokafka", "produce-rdkafka", "produce-rdkafka-grouped"]
FAUST = ["faust-aiokafka", "faust-confluent"]
RATIO_ROWS = {  # the CLIENTS line: what a worker on librdkafka would get, over what it has
    "consume": ("consume-rdkafka-loop", "consume-aiokafka"),
    "produce": ("produce-rdkafka-grouped", "produce-aiokafka"),
}


def clients_line(cpu_per_record: dict[str, list[float]]) -> str:
    """The summary line: per ratio, the median over repeats of (librdkafka / aiokafka) CPU
    per record, each repeat's pair measured back to back; ``nan`` for a missing row."""
    parts = []
    for name, (ours, theirs) in RATIO_ROWS.items():
        pairs = list(
            zip(cpu_per_record.get(ours, []), cpu_per_record.get(theirs, []), strict=False)
        )
        ratio = statistics.median(a / b for a, b in pairs) if pairs else float("nan")
        parts.append(f"{name}_rdkafka/aiokafka={ratio:.2f}")
    return "CLIENTS " + " ".join(parts)


def run_row(row: str, cfg: dict[str, Any], port: int) -> dict[str, Any]:
    """One row in a fresh process: its ``CLIENTROW`` figures, or ``{"error": ...}``."""
    timeout = cfg["timeout_s"]
    if row.startswith("faust-"):
        driver = row.removeprefix("faust-")
        command = worker_command("scripts.bench.client_floor", port)
        timeout = min(timeout, cfg["faust_timeout_s"])  # start-up included
        env = {
            "BENCH_CLIENT_DRIVER": driver,
            "BENCH_CLIENT_TOPIC": cfg["topic"],
            "BENCH_CLIENT_RECORDS": str(cfg["records"]),
            "BENCH_CLIENT_APP": f"perf-{measure.new_tag()}-{driver}",
            "BENCH_CLIENT_DATA": str(Path(cfg["run_dir"]) / f"faust-{driver}"),
            "KAFKA_BOOTSTRAP_SERVERS": cfg["bootstrap"],
        }
    else:
        command = [
            sys.executable,
            "-m",
            "scripts.bench.client_rows",
            row,
            orjson.dumps(cfg).decode(),
        ]
        env = {}
    try:
        proc = subprocess.run(
            command, cwd=measure.ROOT, env={**os.environ, **env},
            capture_output=True, timeout=timeout, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"") + (exc.stderr or b"")
        return {"error": f"no result in {timeout:.0f} s; last output: {_tail(out)}"}
    found = re.search(rb"CLIENTROW (\{.*\})", proc.stdout + proc.stderr)  # Faust logs prints
    if found is None:
        return {"error": f"exit {proc.returncode}: {_tail(proc.stdout + proc.stderr)}"}
    return dict(orjson.loads(found.group(1)))


def _tail(output: bytes) -> str:
    lines = [line for line in output.decode(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if re.search(r"Error|Exception|error", line)]
    return " | ".join((errors or lines)[-3:])[-600:]


async def setup(
    args: argparse.Namespace, run_dir: Path
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The workload's payloads in a topic (the consume rows read it) and in a file (the
    produce rows write it again, to a topic of their own)."""
    payloads = workload(
        args.actions, args.sessions, args.seed, min_batch=1, max_batch=args.max_batch
    )
    tag = measure.new_tag()
    source, sink = f"perf-{tag}.clients-in", f"perf-{tag}.clients-out"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, args.partitions, 1) for name in (source, sink)])
    finally:
        await admin.close()
    await produce(args.bootstrap, source, payloads)
    records_file = run_dir / "payloads.jsonl"
    records_file.write_bytes(b"\n".join(orjson.dumps(p) for p in payloads))
    print(
        f"workload: {len(payloads):,} records ({sum(len(p['actions']) for p in payloads):,} "
        f"actions, {records_file.stat().st_size / len(payloads):.0f} bytes each), "
        f"{args.partitions} partitions, topic {source}"
    )
    return {
        "bootstrap": args.bootstrap, "partitions": args.partitions, "records": len(payloads),
        "actions": sum(len(p["actions"]) for p in payloads),
        "source": source, "sink": sink, "records_file": str(records_file),
        "run_dir": str(run_dir),
        "group": f"perf-{tag}-rdkafka", "timeout_s": args.timeout,
        "faust_timeout_s": args.faust_timeout,
    }, payloads  # fmt: skip


def row_cfg(row: str, base: dict[str, Any]) -> dict[str, Any]:
    if row.startswith("produce-"):
        return {**base, "topic": base["sink"]}
    return {k: v for k, v in base.items() if k != "records_file"} | {"topic": base["source"]}


def report(results: dict[str, list[dict[str, Any]]]) -> dict[str, list[float]]:
    """Prints each row's medians; returns each row's CPU µs per record, repeat by repeat."""
    cpu: dict[str, list[float]] = {}
    print(f"\n{'row':<26} {'CPU us/record':>14} {'(each repeat)':<24} {'records/s':>11}")
    for row, runs in results.items():
        good = [r for r in runs if "error" not in r]
        if not good:
            print(f"{row:<26} failed: {runs[0]['error']}")
            continue
        cpu[row] = [r["cpu_s"] * 1e6 / r["records"] for r in good]
        rates = [r["records"] / r["wall_s"] for r in good]
        each = " ".join(f"{c:.1f}" for c in cpu[row])
        print(
            f"{row:<26} {statistics.median(cpu[row]):>14.2f} {each:<24} {statistics.median(rates):>11,.0f}"
        )
        for r in runs:
            if "error" in r:
                print(f"  {row} failed once: {r['error']}")
    return cpu


async def paced_row(
    args: argparse.Namespace, row: str, base: dict[str, Any], payloads: list[dict[str, Any]]
) -> dict[str, Any]:
    """``row`` reading a fresh topic while ``payloads`` are offered at ``--rate``."""
    topic = f"perf-{measure.new_tag()}.clients-paced"
    admin = AIOKafkaAdminClient(bootstrap_servers=args.bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(topic, args.partitions, 1)])
    finally:
        await admin.close()
    cfg = {**row_cfg(row, base), "topic": topic, "records": len(payloads)}
    reading = asyncio.create_task(asyncio.to_thread(run_row, row, cfg, args.port))
    await asyncio.sleep(2)  # the row's client started and assigned: no backlog to begin with
    await produce(args.bootstrap, topic, payloads, rate=args.rate)
    return await reading


async def main_async(args: argparse.Namespace) -> None:
    run_dir = measure.ROOT / ".bench" / f"clients-{measure.new_tag()}"
    run_dir.mkdir(parents=True)
    rows = [r for r in CONSUME + PRODUCE + FAUST if not args.rows or r in args.rows.split(",")]
    if args.rate:
        rows = [r for r in rows if r not in FAUST]
    try:
        base, payloads = await setup(args, run_dir)
        results: dict[str, list[dict[str, Any]]] = {row: [] for row in rows}
        for repeat in range(args.repeat):
            for row in rows:  # alternated: every row once per repeat, in this order
                if any("error" in r for r in results[row]):
                    continue  # it failed once: its error is the finding
                cfg = row_cfg(row, base)
                if args.rate and row in PRODUCE:  # records/s from actions/s
                    cfg["rate"] = args.rate * base["records"] / base["actions"]
                result = await (
                    paced_row(args, row, base, payloads)
                    if args.rate and row in CONSUME
                    else asyncio.to_thread(run_row, row, cfg, args.port)
                )
                results[row].append(result)
                shown = result.get("error") or (
                    f"{result['cpu_s'] * 1e6 / result['records']:.2f} us/record, "
                    f"{result['records'] / result['wall_s']:,.0f} records/s"
                )
                print(f"  [{repeat + 1}/{args.repeat}] {row}: {shown}", flush=True)
        print(clients_line(report(results)))
    finally:
        await measure.delete_run_topics(args.bootstrap)


def parser() -> argparse.ArgumentParser:
    parse = bench_parser("python -m scripts.bench.clients", __doc__)
    add = parse.add_argument
    add("--repeat", type=int, default=3, help="runs of every row, alternated")
    add(
        "--rows",
        default="",
        help="a comma-separated subset of: " + ",".join(CONSUME + PRODUCE + FAUST),
    )
    add("--port", type=int, default=6150, help="the Faust rows' web port")
    add("--rate", type=float, default=0,
        help="actions/s: the consume rows read while it is offered, the produce rows write "
        "at it (0: a backlog)")  # fmt: skip
    add("--timeout", type=float, default=300, help="seconds a row may take")
    add("--faust-timeout", type=float, default=60,
        help="seconds a Faust row may take, its start-up included")  # fmt: skip
    return parse


def main() -> None:
    asyncio.run(main_async(parser().parse_args()))


if __name__ == "__main__":
    main()
