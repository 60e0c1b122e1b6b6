"""The project's own tooling: the local broker script and the compose file agree."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from tests.support.broker import KAFKA_SCRIPT, ROOT, kafka_version
from tests.support.workers import free_port


def test_compose_names_the_same_kafka_version_as_the_script() -> None:
    compose = (ROOT / "docker-compose.yml").read_text()
    images = re.findall(r"image:\s*apache/kafka:(\S+)", compose)
    assert set(images) == {kafka_version()}


def test_broker_script_prints_readiness_and_reuses_cached_jars(tmp_path: Path) -> None:
    """A second broker on its own port and data dir: no download, start-to-ready printed."""
    env = {**os.environ, "KAFKA_PORT": str(free_port()), "KAFKA_DATA": str(tmp_path / "kafka")}

    def script(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(KAFKA_SCRIPT), *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    try:
        first = script("start")  # may download, if no earlier run cached the jars
        assert first.returncode == 0, first.stderr
        assert script("stop").returncode == 0
        started = script("start")
        assert started.returncode == 0, started.stderr
        assert "using cached Kafka" in started.stderr
        assert "downloading" not in started.stderr
        assert re.search(r"start to ready: \d+ ms", started.stderr)
        assert script("status").returncode == 0
        again = script("start")
        assert "already running" in again.stderr
    finally:
        stopped = script("stop")
    assert stopped.returncode == 0
    assert script("status").returncode != 0
