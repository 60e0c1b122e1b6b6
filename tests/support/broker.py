"""Where the tests get a real Kafka broker.

1. ``KAFKA_BOOTSTRAP_SERVERS`` when set (CI starts the broker itself);
2. otherwise Testcontainers, when a Docker engine answers;
3. otherwise the project's own ``scripts/kafka.sh`` (jars from Maven Central).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KAFKA_SCRIPT = ROOT / "scripts" / "kafka.sh"


def kafka_version() -> str:
    match = re.search(r"^KAFKA_VERSION=(\S+)", KAFKA_SCRIPT.read_text(), re.M)
    assert match, "scripts/kafka.sh names no KAFKA_VERSION"
    return match.group(1)


def docker_engine_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False)
    return probe.returncode == 0


@contextmanager
def kafka_broker() -> Iterator[str]:
    """Yield a bootstrap address of a running broker."""
    if address := os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield address
        return
    if docker_engine_answers():
        from testcontainers.kafka import KafkaContainer

        with KafkaContainer(f"apache/kafka:{kafka_version()}").with_kraft() as kafka:
            yield kafka.get_bootstrap_server()
        return
    port = os.environ.get("KAFKA_PORT", "9092")
    subprocess.run(
        ["bash", str(KAFKA_SCRIPT), "start"], check=True, env={**os.environ, "KAFKA_PORT": port}
    )
    yield f"127.0.0.1:{port}"
