from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from tests.support.broker_cluster import BrokerCluster
from tests.support.cluster import Cluster, reliability_env
from tests.support.kafka_io import delete_topics_at_the_end


@pytest.fixture(scope="session")
async def brokers() -> AsyncIterator[BrokerCluster]:
    """The cluster ``make test-cluster`` started; started here (and stopped after) if not."""
    cluster = BrokerCluster()
    started_here = not cluster.running()
    await cluster.start()
    yield cluster
    if started_here:
        await cluster.stop()


@pytest.fixture
async def make_cluster(
    brokers: BrokerCluster, tmp_path: Path
) -> AsyncIterator[Callable[..., Cluster]]:
    """Workers on the 3-broker cluster; every node is up and in sync when a test begins."""
    await brokers.start()  # nodes an earlier test left down (it failed half-way)
    made: list[Cluster] = []

    def make(**env: str) -> Cluster:
        cluster = Cluster(reliability_env(brokers.bootstrap, tmp_path, **env), tmp_path)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()
        await brokers.start()
        await delete_topics_at_the_end(cluster.env)
