"""The pipeline on a 3-broker cluster (replication factor 3, min.insync.replicas 2) under
the cluster's faults; the delivery invariant (tests/support/invariants.py) after each.

The faults are those of ``scripts/chaos.py --cluster`` (tests/support/broker_cluster.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncIterator, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from tests.fakes.openai_server import FakeOpenAIServer
from tests.integration.test_reliability import llm_env, seed, settle
from tests.support.broker_cluster import (
    BrokerCluster,
    broker_down_with_workers,
    kill_busiest_leader,
    rolling_restart,
    scale_workers,
)
from tests.support.cluster import (
    RECORDER,
    Cluster,
    ManagedWorker,
    endless_stream,
    metric,
    scrape,
)
from tests.support.kafka_io import StreamProducer, read_topic, settings_for
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.cluster]

THRESHOLD = 8


@contextlib.asynccontextmanager
async def mid_stream(
    make_cluster: Callable[..., Cluster], rate: float = 30
) -> AsyncIterator[tuple[Cluster, list[ManagedWorker]]]:
    """A pipeline, a files sink and a recorder, ready, and a stream of waves of sessions
    running while the body (the fault) runs, however long it takes; then the stream
    stops and the invariant must hold once everything produced is delivered."""
    async with FakeOpenAIServer(latency_s=0.02) as llm:
        cluster = make_cluster(**llm_env(llm, THRESHOLD))
        workers = [cluster.pipeline(), cluster.sink("files"), cluster.sink(RECORDER)]
        await cluster.ready()
        payloads = endless_stream(seed(), wave_sessions=20)
        producer = await StreamProducer(cluster.env, payloads, rate=rate).start()
        await wait_for(lambda: len(cluster.records()) >= 20, timeout=60, message="no delivery")
        yield cluster, workers
        assert not producer.done, "the stream stopped before the fault ended"
        await producer.stop()
        await settle(cluster, THRESHOLD, timeout=180)
        assert not await read_topic(cluster.env, "dead-letters")


async def test_topics_and_changelogs_are_replicated_three_times_two_in_sync(
    make_cluster: Callable[..., Cluster], brokers: BrokerCluster
) -> None:
    cluster = make_cluster()
    cluster.pipeline(), cluster.sink("files")
    await cluster.ready()
    settings = settings_for(cluster.env)
    admin = AIOKafkaAdminClient(bootstrap_servers=brokers.bootstrap)
    await admin.start()
    try:
        names = [
            t
            for t in await admin.list_topics()
            if t.startswith((settings.topic_prefix, settings.app_id))
        ]
        assert any(n.endswith("-changelog") for n in names), names
        for described in await admin.describe_topics(names):
            assert {len(p["replicas"]) for p in described["partitions"]} == {3}, described
        configs = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        )
        for response in configs:
            for resource in response.resources:
                values = {entry[0]: entry[1] for entry in resource[4]}
                assert values["min.insync.replicas"] == "2", resource[3]
    finally:
        await admin.close()


async def test_the_busiest_partitions_leader_killed_mid_stream_and_back(
    make_cluster: Callable[..., Cluster], brokers: BrokerCluster
) -> None:
    async with mid_stream(make_cluster) as (cluster, _):
        node = await kill_busiest_leader(brokers, cluster.env, down_s=5)
        print(f"[cluster] node {node} (leader of the busiest partition) killed and back")


async def test_a_rolling_restart_of_all_three_brokers_while_the_stream_runs(
    make_cluster: Callable[..., Cluster], brokers: BrokerCluster
) -> None:
    async with mid_stream(make_cluster, rate=25) as (cluster, _):
        began = time.monotonic()
        await rolling_restart(brokers, cluster.env)
        print(f"[cluster] rolling restart of 3 nodes in {time.monotonic() - began:.0f}s")


async def test_a_broker_down_past_the_session_timeout_with_workers_killed(
    make_cluster: Callable[..., Cluster], brokers: BrokerCluster
) -> None:
    async with mid_stream(make_cluster) as (cluster, (pipeline, _, recorder)):
        # The session timeout is 6 s (FAST_REBALANCE): the node stays down 15. Node 1: the
        # first broker clients know, which Faust's own topic creation asked (and failed).
        victims = [pipeline, recorder]
        node = await broker_down_with_workers(brokers, cluster.env, victims, 15, node=1)
        print(f"[cluster] node {node} down 15s while the pipeline and recorder were killed")


def has_records(cluster: Cluster, count: int) -> bool:
    return len(cluster.records()) >= count


async def first_applied(worker: ManagedWorker) -> bool:
    text = await scrape(worker.url)
    if worker.module == "agents.app":
        return metric(text, "ac_actions_in_total") > 0
    return metric(text, "ac_sink_operations_total", outcome="applied") > 0


async def test_workers_scaled_up_and_down_while_the_stream_runs(
    make_cluster: Callable[..., Cluster],
) -> None:
    """One, two, three pipeline workers and two recorder workers, then back down; prints
    how long a joining worker took from start to its first applied operation."""
    async with mid_stream(make_cluster, rate=25) as (cluster, _):
        for pipelines, sinks in ((2, 2), (3, 2), (1, 1)):
            began = time.monotonic()
            joined = await scale_workers(cluster, pipelines, sinks, RECORDER)
            ready = time.monotonic()
            for worker in joined:
                await wait_for(
                    functools.partial(first_applied, worker),
                    timeout=90,
                    interval=0.2,
                    message=f"{worker.name} applied nothing",
                )
                print(
                    f"[cluster] {worker.name} joined: ready {ready - began:.1f}s after its "
                    f"start, first applied operation {time.monotonic() - ready:.1f}s after that"
                )
            more = functools.partial(has_records, cluster, len(cluster.records()) + 100)
            await wait_for(more, timeout=60, message="the stream stalled")  # a while at this size
