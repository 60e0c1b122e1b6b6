"""(d) The Quix Streams peer (`quix_peer.py`) on the same workload and broker as (c).

Measured as the pipeline worker is: started and ready first, then the backlog is
produced; done when every payload's ``actions_written`` and every summary are in the
broker. Its interpreter is ``--quix-python`` (Quix Streams caps pydantic below the
project's version, so it has its own virtualenv, `.bench/quix-venv`, made on first use).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from scripts.bench.measure import ROOT, cpu_seconds, new_tag
from scripts.bench.workload import backlog, produce, produce_records

PROBE = "__probe__"  # as quix_peer.PROBE: its first record, to know it is assigned


def summaries_expected(payloads: list[dict[str, Any]], threshold: int) -> int:
    """How many summarize requests the workload leads to (one each time K accumulate)."""
    pending: dict[str, int] = {}
    requests = 0
    for payload in payloads:
        n = pending.get(payload["session_id"], 0) + len(payload["actions"])
        requests, pending[payload["session_id"]] = (
            (requests + 1, 0) if n >= threshold else (requests, n)
        )
    return requests


async def wait_records(bootstrap: str, wanted: dict[str, int], partitions: int) -> float:
    """Until each topic holds its wanted number of records; returns when."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
    await consumer.start()
    try:
        parts = [TopicPartition(t, p) for t in wanted for p in range(partitions)]
        shown = 0.0
        while True:
            ends = await consumer.end_offsets(parts)
            held = {t: sum(n for tp, n in ends.items() if tp.topic == t) for t in wanted}
            if all(held[t] >= n for t, n in wanted.items()):
                return time.perf_counter()
            if time.monotonic() - shown > 1:
                print(
                    "  peer: "
                    + ", ".join(
                        f"{t.rsplit('.', 1)[1]} {held[t]:,}/{n:,}" for t, n in wanted.items()
                    ),
                    flush=True,
                )
                shown = time.monotonic()
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()


async def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, partitions, 1) for n in names])
    finally:
        await admin.close()


QUIX_VENV = ROOT / ".bench" / "quix-venv"
QUIX_REQUIREMENT = "quixstreams>=3.28,<4"  # as the bench extra in pyproject.toml


def quix_python(chosen: str) -> str:
    """The peer's interpreter: ``--quix-python``, else ``.bench/quix-venv``, made on first
    use (Quix Streams caps pydantic below the project's version: it needs its own venv)."""
    if chosen:
        return chosen
    python = QUIX_VENV / "bin" / "python"
    if not python.exists():
        print(f"  making {QUIX_VENV} with {QUIX_REQUIREMENT} (once) ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(QUIX_VENV)], check=True)
        subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q",
                        QUIX_REQUIREMENT], check=False)  # fmt: skip
    return str(python)


def quix_python_problem(python: str) -> str | None:
    """Why ``python`` cannot run the peer (one line), or None."""
    try:
        found = subprocess.run(
            [python, "-c", "import quixstreams"], capture_output=True, timeout=60
        )
    except OSError as error:
        return f"--quix-python {python}: {error.strerror}"
    if found.returncode:
        return f"{python} cannot import quixstreams (pip install '{QUIX_REQUIREMENT}' there)"
    return None


def peak_rss_mb(pid: int) -> float:
    match = re.search(r"VmHWM:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text())
    return int(match.group(1)) / 1024 if match else float("nan")


async def bench_quix(
    args: argparse.Namespace, python: str, payloads: list[dict[str, Any]], actions: int
) -> dict[str, float]:
    """The peer on a backlog: actions/s and CPU per action of its process (all threads)."""
    tag = new_tag()
    prefix, run_dir = f"perf-{tag}.", ROOT / ".bench" / f"quix-{tag}"
    run_dir.mkdir(parents=True)
    outputs = {
        name: prefix + "peer-" + name
        for name in ("actions", "actions_written", "summarize", "summaries")
    }
    await create_topics(args.bootstrap, list(outputs.values()), args.partitions)
    env = {
        "QUIX_PEER_BOOTSTRAP": args.bootstrap,
        "QUIX_PEER_PREFIX": prefix,
        "QUIX_PEER_INPUT": outputs["actions"],
        "QUIX_PEER_STATE_DIR": str(run_dir / "state"),
        "QUIX_PEER_THRESHOLD": str(args.threshold),
    }
    with (run_dir / "peer.log").open("wb") as log:
        proc = await asyncio.create_subprocess_exec(
            python,
            str(Path(__file__).with_name("quix_peer.py")),
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=log,
        )
    assert proc.stdout is not None
    try:
        await produce(args.bootstrap, outputs["actions"], [{"session_id": PROBE, "actions": []}])
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 120)
        except TimeoutError:
            line = b""
        if line.strip() != b"READY":
            raise SystemExit(f"the Quix peer did not start; see {run_dir / 'peer.log'}")
        cpu_start = cpu_seconds(proc.pid)
        records = backlog(payloads)  # encoded before the window, as for (b) and (c)
        print(f"  producing {len(payloads):,} payloads to {outputs['actions']} ...")
        start = time.perf_counter()
        await produce_records(args.bootstrap, outputs["actions"], records)
        wanted = {
            outputs["actions_written"]: len(payloads),
            outputs["summaries"]: summaries_expected(payloads, args.threshold),
        }
        done = await wait_records(args.bootstrap, wanted, args.partitions)
        cpu, rss = cpu_seconds(proc.pid) - cpu_start, peak_rss_mb(proc.pid)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
    return {
        "rate": actions / (done - start),
        "cpu_us_per_action": cpu * 1e6 / actions,
        "rss_mb": rss,
    }
