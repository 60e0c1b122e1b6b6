"""The 3-broker cluster of ``scripts/kafka.sh --brokers 3`` and the faults run against it.

Used by ``tests/cluster/`` and ``scripts/chaos.py --cluster``: each fault is one
coroutine here, so the tests and the soak run the same thing.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition

from tests.support.cluster import Cluster, ManagedWorker, kill_pidfile
from tests.support.kafka_io import settings_for
from tests.support.waiting import wait_for
from tests.support.workers import ROOT

__all__ = [
    "RECOVERY_S",
    "BrokerCluster",
    "broker_down_with_workers",
    "cluster_ready",
    "kill_busiest_leader",
    "rolling_restart",
    "scale_workers",
]

BROKERS = 3
# A restarted worker recovers its tables from the changelogs first: after a long soak,
# on a loaded machine, that took over 90 s (the default wait).
RECOVERY_S = 300.0
BASE_PORT = int(os.environ.get("KAFKA_CLUSTER_PORT", "19092"))


@dataclass
class BrokerCluster:
    """Nodes 1..brokers of ``kafka.sh --brokers``: node i serves ``base_port + 2(i-1)``."""

    brokers: int = BROKERS
    base_port: int = BASE_PORT
    data_dir: Path = ROOT / ".kafka-data" / f"cluster-{BASE_PORT}"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{self.port(n)}" for n in self.nodes)

    @property
    def nodes(self) -> range:
        return range(1, self.brokers + 1)

    def port(self, node: int) -> int:
        return self.base_port + 2 * (node - 1)

    def run(self, command: str, node: int | None = None) -> None:
        """``kafka.sh start|stop`` for the cluster, or for one node of it."""
        args = ["bash", str(ROOT / "scripts" / "kafka.sh"), command, "--brokers", str(self.brokers)]
        env = {**os.environ, "KAFKA_CLUSTER_PORT": str(self.base_port)}
        env["KAFKA_DATA"] = str(self.data_dir)
        if node is not None:
            args += ["--node", str(node)]
        subprocess.run(args, check=True, env=env, timeout=150, capture_output=True)

    def running(self) -> bool:
        try:
            self.run("status")
        except subprocess.CalledProcessError:
            return False
        return True

    async def start(self, node: int | None = None) -> None:
        await asyncio.to_thread(self.run, "start", node)

    async def stop(self, node: int | None = None) -> None:
        await asyncio.to_thread(self.run, "stop", node)

    async def kill(self, node: int) -> None:
        """SIGKILL one node (no controlled shutdown)."""
        await asyncio.to_thread(kill_pidfile, self.data_dir / f"node-{node}" / "broker.pid")

    async def busiest_leader(self, env: dict[str, str]) -> int:
        """The node leading the partition of ``actions`` that holds the most records."""
        settings = settings_for(env)
        topic = settings.topic("actions")
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await consumer.start()
        await admin.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
            ends = await consumer.end_offsets(tps)
            [described] = await admin.describe_topics([topic])
            leaders = {p["partition"]: p["leader"] for p in described["partitions"]}
        finally:
            await consumer.stop()
            await admin.close()
        busiest = max(tps, key=lambda tp: ends[tp]).partition
        return int(leaders[busiest])  # kafka.sh gives node i the node.id i

    async def out_of_sync(self, env: dict[str, str]) -> list[str]:
        """Partitions of the run's topics and of the group offsets whose ISR lacks a replica."""
        settings = settings_for(env)
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await admin.start()
        try:
            names = [t for t in await admin.list_topics() if t.startswith(settings.topic_prefix)]
            names += [t for t in await admin.list_topics() if t.startswith(settings.app_id)]
            described = await admin.describe_topics([*names, "__consumer_offsets"])
        finally:
            await admin.close()
        return [
            f"{t['topic']}:{p['partition']}"
            for t in described
            for p in t["partitions"]
            if len(p["isr"]) < len(p["replicas"]) or p["leader"] < 0
        ]

    async def wait_in_sync(self, env: dict[str, str], timeout: float = 120.0) -> None:
        lagging: list[str] = []

        async def in_sync() -> bool:
            nonlocal lagging
            try:
                lagging = await self.out_of_sync(env)
            except Exception as exc:  # a node still starting: ask again
                lagging = [repr(exc)]
            return not lagging

        await wait_for(
            in_sync, timeout=timeout, interval=0.5, message=lambda: f"out of sync: {lagging[:8]}"
        )


async def kill_busiest_leader(
    brokers: BrokerCluster, env: dict[str, str], down_s: float = 5.0
) -> int:
    """kill -9 the leader of the busiest partition mid-stream; bring it back; wait for the
    replicas to catch up. Returns the node."""
    node = await brokers.busiest_leader(env)
    await brokers.kill(node)
    await asyncio.sleep(down_s)  # the outage itself: the stream runs on without the node
    await brokers.start(node)
    await brokers.wait_in_sync(env)
    return node


async def rolling_restart(brokers: BrokerCluster, env: dict[str, str]) -> None:
    """Stop and start each node in turn (controlled shutdown), each back in sync before the
    next goes, as an operator upgrading the cluster would."""
    for node in brokers.nodes:
        await brokers.stop(node)
        await brokers.start(node)
        await brokers.wait_in_sync(env)


async def broker_down_with_workers(
    brokers: BrokerCluster,
    env: dict[str, str],
    workers: list[ManagedWorker],
    down_s: float,
    node: int | None = None,
) -> int:
    """A node down for ``down_s`` (longer than the session timeout) while ``workers`` are
    killed at once; the workers come back while the node is still down."""
    node = node or await brokers.busiest_leader(env)
    await brokers.kill(node)
    for worker in workers:
        worker.kill()
    started = time.monotonic()
    for worker in workers:
        worker.start()
    await cluster_ready(workers)
    await asyncio.sleep(max(0.0, down_s - (time.monotonic() - started)))  # the outage
    await brokers.start(node)
    await brokers.wait_in_sync(env)
    return node


async def cluster_ready(workers: list[ManagedWorker]) -> None:
    await asyncio.gather(*(w.wait_ready(RECOVERY_S) for w in workers))


async def scale_workers(
    cluster: Cluster, pipelines: int, sinks: int, sink_spec: str
) -> list[ManagedWorker]:
    """Start or stop (SIGTERM) workers until ``pipelines`` pipeline workers and ``sinks``
    ``sink_spec`` workers run; returns the ones started (ready)."""
    started: list[ManagedWorker] = []
    for module, wanted in (("agents.app", pipelines), ("sinks.app", sinks)):
        running = [
            w
            for w in cluster.workers
            if w.module == module
            and not w.down
            and (module == "agents.app" or w.env.get("AC_SINK") == sink_spec)
        ]
        for worker in running[wanted:][::-1]:
            await asyncio.to_thread(worker.stop)
        for _ in range(wanted - len(running)):
            stopped = [
                w
                for w in cluster.workers
                if w.module == module
                and w.down
                and (module == "agents.app" or w.env.get("AC_SINK") == sink_spec)
            ]
            if stopped:
                started.append(stopped[0].start())
            elif module == "agents.app":
                started.append(cluster.pipeline())
            else:
                started.append(cluster.sink(sink_spec))
    if started:
        await cluster.ready(*started, timeout=RECOVERY_S)
    return started
