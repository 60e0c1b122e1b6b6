"""docker-compose.yml's cluster profile and ``scripts/kafka.sh --brokers 3`` configure the
brokers alike, and its workers replicate as the brokers allow."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml

from tests.support.broker import KAFKA_SCRIPT, ROOT

# Where a node is reached and stored: differs between loopback and containers.
ADDRESSES = {"listeners", "advertised.listeners", "log.dirs", "controller.quorum.voters"}


def script_properties(node: int) -> dict[str, str]:
    out = subprocess.run(
        ["bash", str(KAFKA_SCRIPT), "config", "--brokers", "3", "--node", str(node)],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def compose_properties(environment: dict[str, Any]) -> dict[str, str]:
    """The apache/kafka image's mapping: KAFKA_FOO_BAR is the property foo.bar."""
    return {
        name.removeprefix("KAFKA_").lower().replace("_", "."): str(value)
        for name, value in environment.items()
        if name.startswith("KAFKA_") and name != "KAFKA_HEAP_OPTS"
    }


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    return dict(yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"])


@pytest.mark.parametrize("node", [1, 2, 3])
def test_the_cluster_profile_brokers_are_configured_as_the_script_does(
    services: dict[str, Any], node: int
) -> None:
    script = script_properties(node)
    service = services[f"kafka-{node}"]
    compose = compose_properties(service["environment"])
    assert "cluster" in service["profiles"]
    assert {k: v for k, v in script.items() if k not in ADDRESSES} == {
        k: v for k, v in compose.items() if k not in ADDRESSES
    }
    voters = [v.split("@")[0] for v in script["controller.quorum.voters"].split(",")]
    assert voters == [v.split("@")[0] for v in compose["controller.quorum.voters"].split(",")]
    heap = re.search(r"KAFKA_HEAP:-(\w+)}", KAFKA_SCRIPT.read_text().split("brokers > 1")[-1])
    assert heap and f"-Xmx{heap.group(1)}" in service["environment"]["KAFKA_HEAP_OPTS"]


def test_the_cluster_profile_workers_replicate_as_the_brokers_allow(
    services: dict[str, Any],
) -> None:
    script = script_properties(1)
    for name, replicas in (("pipeline-cluster", 3), ("sink-files-cluster", 2)):
        service = services[name]
        env = service["environment"]
        assert "cluster" in service["profiles"]
        assert service["deploy"]["replicas"] == replicas
        assert str(env["AC_REPLICATION_FACTOR"]) == script["default.replication.factor"]
        assert str(env["AC_MIN_INSYNC_REPLICAS"]) == script["min.insync.replicas"]
        assert len(env["KAFKA_BOOTSTRAP_SERVERS"].split(",")) == 3


def test_the_single_broker_runs_with_the_scripts_heap(services: dict[str, Any]) -> None:
    # Both use Kafka's own JVM options (the image's defaults; scripts/kafka.sh copies them),
    # so the heap is what remains to keep in step.
    heap = re.search(r"local heap=\$\{KAFKA_HEAP:-(\w+)\}", KAFKA_SCRIPT.read_text())
    assert heap, "scripts/kafka.sh no longer sets the single broker's heap where expected"
    opts = services["kafka"]["environment"]["KAFKA_HEAP_OPTS"].split()
    assert opts == [f"-Xmx{heap.group(1)}", f"-Xms{heap.group(1)}"]
