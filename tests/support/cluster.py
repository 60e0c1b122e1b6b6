"""Workers that can be killed and restarted, a broker of a test's own, and /metrics.

Used by ``tests/integration/test_reliability.py`` and ``scripts/chaos.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from tests.support.kafka_io import uncommitted
from tests.support.waiting import wait_for, wait_for_sync
from tests.support.workers import FAST_REBALANCE, ROOT, Worker, free_port, unique_env

__all__ = [
    "Cluster",
    "ManagedWorker",
    "SeparateBroker",
    "endless_stream",
    "health",
    "input_partitions",
    "metric",
    "reliability_env",
    "scrape",
]

RECORDER = "tests.support.plugins:RecordingSink"
FLAKY = "tests.support.sinks:FlakyRecordingSink"

# The topics each kind of worker consumes (a link-aware sink also consumes ``links``).
INPUTS = {"agents.app": ("actions", "summarize"), "sinks.app": ("context",)}


def read_complete_records(path: Path) -> list[dict[str, Any]]:
    """A recorder's log, without a last line still being written (the test polls it live)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [orjson.loads(line) for line in complete.splitlines() if line.strip()]


def endless_stream(seed: int, wave_sessions: int) -> Iterator[dict[str, Any]]:
    """Waves of new sessions, each wave's sessions interleaved, until the producer stops."""
    for wave in itertools.count():
        plans = plan_sessions(
            wave_sessions, mean_length=30, seed=seed * 1000 + wave, prefix=f"w{wave}"
        )
        yield from interleaved_payloads(plans, seed=seed * 1000 + wave)


def reliability_env(bootstrap: str, workdir: Path, **overrides: str) -> dict[str, str]:
    """Per-test settings, with quick failure detection so restarts rejoin in seconds."""
    return unique_env(bootstrap, workdir, **{**FAST_REBALANCE, **overrides})


@dataclass
class ManagedWorker(Worker):
    """A worker that can be SIGKILLed and started again, appending to the same log."""

    name: str = ""
    starts: int = 0
    kills: int = 0
    down: bool = False  # stopped or killed on purpose
    group: str = ""  # its consumer group, as its /healthz reports it (see consumer_groups)
    inputs: tuple[str, ...] = ()
    _mark: int = 0  # log size when last started: "Ready" must come after it

    def start(self) -> ManagedWorker:
        if hasattr(self, "_log"):
            self._log.close()
        self.down = False
        self._mark = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.starts += 1
        super().start()
        return self

    def since_start(self) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as handle:
            handle.seek(self._mark)
            return handle.read().decode("utf-8", "replace")

    async def wait_ready(self, timeout: float = 90.0) -> ManagedWorker:
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.name} exited:\n{self.since_start()[-4000:]}")
            return "[^Worker]: Ready" in self.since_start()

        await wait_for(
            ready, timeout=timeout, interval=0.1, message=lambda: self.since_start()[-3000:]
        )
        return self

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        self.down = True
        if self.alive:
            self.kills += 1
        super().kill()

    def stop(self, timeout: float = 30.0) -> None:
        self.down = True
        super().stop(timeout)


@dataclass
class Cluster:
    """The workers of one run: pipeline worker(s) and sink workers, each its own process."""

    env: dict[str, str]
    workdir: Path
    workers: list[ManagedWorker] = field(default_factory=list)

    @property
    def record_file(self) -> Path:
        return self.workdir / "records.jsonl"

    @property
    def files_dir(self) -> Path:
        return Path(self.env["AC_FILES_DIR"])

    def pipeline(self, **env: str) -> ManagedWorker:
        """A pipeline worker; the second and later ones get their own data directory."""
        n = sum(1 for w in self.workers if w.module == "agents.app")
        extra = {} if n == 0 else {"AC_DATA_DIR": str(self.workdir / f"data-{n}")}
        worker = ManagedWorker(
            "agents.app",
            {**self.env, **extra, **env},
            self.workdir / f"pipeline-{n}.log",
            name=f"pipeline-{n}",
        )
        self.workers.append(worker)
        return worker.start()

    def sink(self, spec: str, *, record_file: Path | None = None, **env: str) -> ManagedWorker:
        """A sink worker; the second and later ones of a sink get their own data directory
        and log (they share its consumer group and record file)."""
        short = spec.rsplit(":", 1)[-1].lower()
        n = sum(1 for w in self.workers if w.env.get("AC_SINK") == spec)
        name = f"sink-{short}" + (f"-{n}" if n else "")
        extra = {} if n == 0 else {"AC_DATA_DIR": str(self.workdir / f"data-{name}")}
        worker = ManagedWorker(
            "sinks.app",
            {
                **self.env,
                **extra,
                "AC_SINK": spec,
                "AC_RECORD_FILE": str(record_file or self.record_file),
                **env,
            },
            self.workdir / f"{name}.log",
            name=name,
        )
        self.workers.append(worker)
        return worker.start()

    async def ready(self, *workers: ManagedWorker, timeout: float = 90.0) -> None:
        await asyncio.gather(*(w.wait_ready(timeout) for w in workers or self.workers))

    async def consumer_groups(self) -> list[tuple[str, tuple[str, ...]]] | None:
        """The consumer groups of the running workers with their input topics, the
        pipeline's first; ``None`` while a running worker has not told its group yet."""
        groups: dict[str, tuple[str, ...]] = {}
        for w in self.workers:
            if w.down:
                continue
            if not w.group:
                status = await health(w.url)
                if not status.get("app"):
                    return None
                w.group, w.inputs = str(status["app"]), INPUTS[w.module]
                if any(".links:" in tp for tp in status.get("assigned_partitions", [])):
                    w.inputs += ("links",)
            groups[w.group] = tuple(sorted({*groups.get(w.group, ()), *w.inputs}))
        return sorted(groups.items(), key=lambda item: "actions" not in item[1])

    async def wait_committed(self, timeout: float = 60.0) -> None:
        """Wait until every consumer group has processed, acknowledged and committed all of
        its input: nothing is in flight, nothing is left to redeliver, so no operation is
        still to come (not even a late duplicate) unless a worker crashes."""
        behind: dict[str, int] | None = None

        async def committed() -> bool:
            nonlocal behind
            self.check_alive()
            groups = await self.consumer_groups()
            behind = None if groups is None else await uncommitted(self.env, groups)
            return behind == {}

        await wait_for(
            committed,
            timeout=timeout,
            interval=0.5,
            message=lambda: f"not committed (group partition: offsets behind): {behind}",
        )

    def records(self, path: Path | None = None) -> list[dict[str, Any]]:
        return read_complete_records(path or self.record_file)

    def check_alive(self) -> None:
        """Fail at once if a worker died that nobody killed."""
        for w in self.workers:
            if not w.down and w.process is not None and w.process.poll() is not None:
                raise AssertionError(
                    f"{w.name} exited with {w.process.poll()}:\n{w.since_start()[-4000:]}"
                )

    def stop(self, timeout: float = 10.0) -> None:
        for w in self.workers:
            w.stop(timeout)

    def logs(self) -> str:
        return "\n".join(f"==== {w.name}\n{w.log_text()[-3000:]}" for w in self.workers)


async def scrape(url: str) -> str:
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"{url}/metrics")
        response.raise_for_status()
        return response.text


async def health(url: str) -> dict[str, Any]:
    """A worker's /healthz (503 while rebalancing or recovering), or {} if it does not answer."""
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            return dict((await client.get(f"{url}/healthz")).json())
    except (httpx.HTTPError, ValueError):
        return {}


async def input_partitions(worker: Worker, topic_suffix: str = ".actions") -> set[int]:
    """The partitions of the input topic this worker owns, once it is ready (else empty)."""
    status = await health(worker.url)
    if not status.get("ready"):
        return set()
    return {
        int(tp.rsplit(":", 1)[1])
        for tp in status.get("assigned_partitions", [])
        if tp.rsplit(":", 1)[0].endswith(topic_suffix)
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    total = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(match.group(3))
    return total


def _two_free_ports() -> int:
    """A port p with p + 1 free too (the broker's controller listener)."""
    for _ in range(50):
        port = free_port()
        with contextlib.suppress(OSError), socket.socket() as s:
            s.bind(("127.0.0.1", port + 1))
            return port
    raise RuntimeError("no two adjacent free ports")


def kill_pidfile(pidfile: Path) -> None:
    """SIGKILL the broker ``kafka.sh`` started with this pid file, and wait until it is gone."""
    if pidfile.exists():
        pid = int(pidfile.read_text())
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for_sync(lambda: not _alive(pid), timeout=30, interval=0.1)
        pidfile.unlink(missing_ok=True)


@dataclass
class SeparateBroker:
    """A broker of the test's own (port, data dir), so restarting it disturbs nobody."""

    data_dir: Path
    port: int = field(default_factory=_two_free_ports)
    restarts: int = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self, command: str) -> None:
        env = {**os.environ, "KAFKA_PORT": str(self.port), "KAFKA_DATA": str(self.data_dir)}
        subprocess.run(
            ["bash", str(ROOT / "scripts" / "kafka.sh"), command],
            check=True,
            env=env,
            timeout=150,
            capture_output=True,
        )

    def start(self) -> SeparateBroker:
        self._run("start")
        return self

    def stop(self) -> None:
        self._run("stop")

    def kill(self) -> None:
        """SIGKILL the broker (no clean shutdown)."""
        kill_pidfile(self.data_dir / "broker.pid")

    async def restart(self, *, down_s: float = 2.0, hard: bool = False) -> None:
        await asyncio.to_thread(self.kill if hard else self.stop)
        await asyncio.sleep(down_s)
        await asyncio.to_thread(self.start)
        self.restarts += 1

    def remove(self) -> None:
        with contextlib.suppress(Exception):
            self.stop()
        self.kill()
        shutil.rmtree(self.data_dir, ignore_errors=True)


@contextlib.contextmanager
def separate_broker(data_dir: Path) -> Iterator[SeparateBroker]:
    broker = SeparateBroker(data_dir).start()
    try:
        yield broker
    finally:
        broker.remove()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
