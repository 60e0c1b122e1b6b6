"""The workers under measurement, and reading them: processes, CPU, RSS, /metrics, topics."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx
from aiokafka.admin import AIOKafkaAdminClient

from streams.app import worker_command
from streams.settings import Settings
from streams.topics import ensure_topics

ROOT = Path(__file__).resolve().parents[2]


class Workers:
    """The pipeline worker and a null sink worker, as `faust worker` processes.

    The newest ``Workers`` is the one ``wait_metric`` checks for a crashed worker.
    """

    def __init__(self, env: dict[str, str], run_dir: Path, port: int, tree: Path = ROOT) -> None:
        global WORKERS
        self.env, self.run_dir, self.port = env, run_dir, port
        # The checkout the workers run from (``--mode sink --tree``): first on their path.
        self.tree = tree
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []
        self.spies: list[subprocess.Popen[bytes]] = []
        WORKERS = self

    def start(self, module: str, name: str, port: int, **extra: str) -> None:
        log = self.run_dir / f"{name}.log"
        loop = {} if LOOP == "aio" else {"F_LOOP": LOOP}
        path = {} if self.tree == ROOT else {"PYTHONPATH": str(self.tree)}
        proc = subprocess.Popen(
            worker_command(module, port),
            cwd=self.tree,
            env={**os.environ, **self.env, **loop, **path, **extra, "AC_WEB_PORT": str(port)},
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
        )
        self.procs.append((proc, log))

    def profile(self) -> None:
        """With --profile, py-spy samples each worker until ``stop_profiles``, from outside:
        the workers' CPU figures stay their own (see :func:`spy_command`)."""
        if not PROFILE:
            return
        for proc, log in self.procs:
            out = log.with_suffix(".pyspy.txt")
            self.spies.append(subprocess.Popen(
                spy_command(proc.pid, out, PROFILE),
                stdout=subprocess.DEVNULL, stderr=log.with_suffix(".pyspy.log").open("wb"),
            ))  # fmt: skip
            print(f"  profiling {log.stem} into {out} at {PROFILE} Hz")

    def stop_profiles(self) -> None:
        for spy in self.spies:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
        for spy in self.spies:
            spy.wait(timeout=60)
        self.spies.clear()

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
        return [cpu_seconds(proc.pid) for proc, _ in self.procs]

    def runqueue_seconds(self) -> list[float]:
        """Each worker's threads' wait for a core so far (:func:`runqueue_seconds`)."""
        return [runqueue_seconds(proc.pid) for proc, _ in self.procs]

    def rss_mb(self, index: int = 0) -> float:
        status = Path(f"/proc/{self.procs[index][0].pid}/status")
        match = re.search(r"VmRSS:\s+(\d+) kB", status.read_text()) if status.exists() else None
        return int(match.group(1)) / 1024 if match else float("nan")

    def stop(self) -> None:
        self.stop_profiles()
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


PROFILE = 0  # --profile: samples a second, 0 for none


def spy_command(pid: int, out: Path, rate: int) -> list[str]:
    """py-spy recording ``pid`` into ``out`` (raw) at ``rate`` Hz, pausing the worker for
    each sample: without the pause, 4.4% of a null sink's samples (1,000 Hz) held stacks
    no code makes (``observe`` calling the store), frames read while Python reused them,
    and the shares moved by up to 8 points (docs/performance.md). ``--gil``: only while
    the worker runs Python; without it a thread blocked in a loopback ``sendto`` counted
    as busy (18% of the pipeline at 500 actions/s, against ~10% kernel time in ``perf``)."""
    spy = Path(sys.executable).with_name("py-spy")
    return [str(spy), "record", "--gil", "-f", "raw", "-r", str(rate), "-o", str(out),
            "--pid", str(pid)]  # fmt: skip


LOOP = "aio"  # --loop
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
    """Poll until the metric reaches target; prints progress; returns the time it did.

    Polled every 50 ms only near the end (:func:`poll_interval`): each scrape renders the
    worker's whole exposition, and at 20 a second it was 2.5% of the null sink's CPU."""
    deadline = time.monotonic() + timeout
    last, shown = -1.0, 0.0
    first, started = None, time.monotonic()
    while time.monotonic() < deadline:
        value = metric(await scrape(client, port), name, **labels)
        if first is None:
            first = value
        if value != last and time.monotonic() - shown > 1:
            print(f"  {label}: {value:,.0f}/{target:,.0f}", flush=True)
            last, shown = value, time.monotonic()
        if value >= target:
            print(f"  {label}: {value:,.0f} done")
            return time.perf_counter()
        if WORKERS is not None:
            WORKERS.check_alive()
        await asyncio.sleep(
            poll_interval(value - first, time.monotonic() - started, target - value)
        )
    raise SystemExit(f"\n{label}: stuck at {last} of {target}")


def poll_interval(done: float, elapsed_s: float, remaining: float) -> float:
    """A quarter of the time the rest should take at the rate so far, within 50-500 ms."""
    if done <= 0 or elapsed_s <= 0:
        return 0.05  # no rate yet
    return min(max(remaining / (done / elapsed_s) / 4, 0.05), 0.5)


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


def worker_env(
    args: argparse.Namespace, app_id: str, run_dir: Path, **settings: str
) -> dict[str, str]:
    """A run's worker settings: its own app id, topics (``<app id>.``) and state directory,
    an instant LLM; ``settings`` (AC_... names) add to them or replace them."""
    return {
        "KAFKA_BOOTSTRAP_SERVERS": args.bootstrap,
        "AC_APP_ID": app_id,
        "AC_TOPIC_PREFIX": f"{app_id}.",
        "AC_PARTITIONS": str(args.partitions),
        "AC_DATA_DIR": str(run_dir / "state"),
        "AC_THRESHOLD": str(args.threshold),
        "AC_LLM_CALLABLE": "scripts.bench.plugins:instant",
        "AC_STORE": args.store,
        "AC_IDLE_TIMEOUT_S": "3600",
        "BENCH_SUMMARY_CHARS": str(getattr(args, "summary_chars", 0)),
        **settings,
    }


async def new_run(args: argparse.Namespace) -> tuple[dict[str, str], Path]:
    """A fresh run's settings, with its topics created (and empty)."""
    tag = new_tag()
    run_dir = ROOT / ".bench" / tag
    run_dir.mkdir(parents=True)
    env = worker_env(args, f"perf-{tag}", run_dir)
    await ensure_topics(settings_of(args, env))
    return env, run_dir


def settings_of(args: argparse.Namespace, env: dict[str, str]) -> Settings:
    return Settings(
        kafka_bootstrap_servers=args.bootstrap,
        topic_prefix=env["AC_TOPIC_PREFIX"],
        partitions=args.partitions,
    )


def new_tag() -> str:
    """A fresh run's tag: its topics, group and state directory are named with it, and the
    topics holding one of this invocation's tags are deleted at its end. The names start
    ``perf``: older copies of this benchmark delete every new topic named ``bench*``."""
    tag = uuid.uuid4().hex[:6]
    RUN_TAGS.add(tag)
    return tag


RUN_TAGS: set[str] = set()


async def delete_run_topics(bootstrap: str) -> None:
    """Found with a broker that had kept every run's topics (12,000 partitions, 28 GB):
    it spent a core on its own upkeep, and p99 at 5,000 actions/s went from <= 100 ms to
    <= 1 s. A run leaves nothing behind, and touches no one else's topics (shared broker)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        topics = [t for t in await admin.list_topics() if any(tag in t for tag in RUN_TAGS)]
        if topics:
            await admin.delete_topics(sorted(topics))
            print(f"deleted this run's {len(topics)} topics")
    finally:
        await admin.close()


def kafka_data(bootstrap: str) -> Path:
    """Where ``scripts/kafka.sh`` keeps the broker of ``bootstrap`` (``KAFKA_DATA`` overrides)."""
    return Path(os.environ.get("KAFKA_DATA", ROOT / ".kafka-data" / bootstrap.rsplit(":", 1)[1]))


def broker_cpu_seconds(bootstrap: str) -> float:
    """The local broker's CPU time so far (``scripts/kafka.sh``'s pid file), NaN without it."""
    try:
        return cpu_seconds(int((kafka_data(bootstrap) / "broker.pid").read_text()))
    except (OSError, ValueError):
        return float("nan")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def runqueue_seconds(pid: int) -> float:
    """How long a process's threads have waited, runnable, for a core so far (the second
    field of /proc/<pid>/task/*/schedstat): CPU it wanted and did not get."""
    waited = 0
    for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        try:
            waited += int(task.read_text().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waited / 1e9


def machine_ticks() -> tuple[int, int, int]:
    """The machine's CPU ticks so far, all cores (/proc/stat): (busy, stolen, total).

    Steal is time the hypervisor gave our virtual cores to someone else: on this kind
    of machine it comes and goes, and a run that lost 10% of its cores to it is slower
    for no reason in the code (docs/performance.md)."""
    user, nice, system, idle, iowait, irq, softirq, steal = (
        int(n) for n in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def machine_shares(start: tuple[int, int, int], end: tuple[int, int, int]) -> dict[str, float]:
    """Between two :func:`machine_ticks`: the share of the cores busy and stolen."""
    busy, steal, total = (b - a for a, b in zip(start, end, strict=True))
    return {"machine_busy": busy / max(total, 1), "machine_steal": steal / max(total, 1)}
