"""Run real ``faust worker`` processes for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from streams.app import worker_command
from tests.support.waiting import wait_for

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Faust reads these from the environment. A SIGKILLed member stays in its consumer
# group until its session times out (Faust's default: 60 s), holding its
# partitions, and a restarted worker waits that long to join; 6 s is the broker's
# minimum (``group.min.session.timeout.ms``). Every test that kills a worker uses it.
FAST_REBALANCE = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


def unique_env(bootstrap: str, workdir: Path, **overrides: str) -> dict[str, str]:
    """Settings for one test: its own topics, consumer groups and directories."""
    tag = uuid.uuid4().hex[:8]
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
        "AC_APP_ID": f"test-{tag}",
        "AC_TOPIC_PREFIX": f"t{tag}.",
        "AC_PARTITIONS": "4",
        "AC_DATA_DIR": str(workdir / "data"),
        "AC_FILES_DIR": str(workdir / "context"),
        "AC_IDLE_CHECK_INTERVAL_S": "1",
    }
    env.update(overrides)
    return env


@dataclass
class Worker:
    """One ``faust -A <module> worker`` process with its log in a file."""

    module: str
    env: dict[str, str]
    log_path: Path
    web_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        env = {**os.environ, **self.env, "AC_WEB_PORT": str(self.web_port), "PYTHONUNBUFFERED": "1"}
        env.pop("OPENAI_API_KEY", None)  # tests choose their LLM explicitly
        self._log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            worker_command(self.module, self.web_port),
            cwd=ROOT,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        return self

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    async def wait_ready(self, timeout: float = 90.0) -> Worker:
        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"worker {self.module} exited:\n{self.log_text()[-4000:]}")
            return "Ready" in self.log_text()

        await wait_for(
            ready, timeout=timeout, interval=0.1, message=lambda: self.log_text()[-3000:]
        )
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def kill(self) -> None:
        """SIGKILL: no shutdown hooks, no final commit."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)

    def stop(self, timeout: float = 30.0) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        if hasattr(self, "_log"):
            self._log.close()
