"""Topic creation and the dead-letter topic's message limit, on a real broker."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from streams.settings import ConfigurationError, Settings
from streams.topics import DEAD_LETTER_MAX_BYTES, TOPIC_NAMES, Replication, ensure_topics
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kafka


@pytest.fixture
async def admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    client = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
    await client.start()
    yield client
    await client.close()


async def topic_config(admin: AIOKafkaAdminClient, name: str) -> dict[str, str]:
    [response] = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, name)])
    return {entry[0]: entry[1] for entry in response.resources[0][4]}


async def described_limit(describe: Callable[[], Awaitable[dict[str, str]]], limit: int) -> bool:
    return int((await describe()).get("max.message.bytes", 0)) == limit


@pytest.mark.parametrize(
    ("existing_limit", "expected_limit"),
    [(None, DEAD_LETTER_MAX_BYTES), (str(DEAD_LETTER_MAX_BYTES * 2), DEAD_LETTER_MAX_BYTES * 2)],
)
async def test_an_existing_dead_letter_topic_gets_the_larger_limit_and_keeps_its_settings(
    kafka_bootstrap: str,
    admin: AIOKafkaAdminClient,
    existing_limit: str | None,
    expected_limit: int,
) -> None:
    """Made by an older version or by hand: raised to the limit (never lowered), and
    its own other settings survive (AlterConfigs replaces all of them)."""
    settings = Settings(
        kafka_bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"t{uuid.uuid4().hex[:8]}.",
        partitions=2,
    )
    name = settings.topic("dead-letters")
    own = {"retention.ms": "86400000", "cleanup.policy": "delete"}
    if existing_limit:
        own["max.message.bytes"] = existing_limit
    await admin.create_topics([NewTopic(name, 2, 1, topic_configs=own)])
    config: dict[str, str] = {}

    async def described() -> dict[str, str]:  # the broker's metadata follows a moment later
        nonlocal config
        config = await topic_config(admin, name)
        return config

    try:
        await wait_for(described, timeout=10, message="the topic was not created")
        await ensure_topics(settings)
        await wait_for(
            lambda: described_limit(described, expected_limit),
            timeout=10,
            message=lambda: str(config),
        )
        assert config["retention.ms"] == "86400000"
        await ensure_topics(settings)  # again: nothing to change
        assert await described_limit(described, expected_limit)
    finally:
        await admin.delete_topics([settings.topic(n) for n in TOPIC_NAMES])


@pytest.mark.parametrize(
    ("brokers", "factor", "min_insync"), [(1, 1, 1), (2, 2, 1), (3, 3, 2), (5, 3, 2)]
)
def test_replication_follows_the_cluster_size(brokers: int, factor: int, min_insync: int) -> None:
    assert Replication.for_cluster(Settings(), brokers) == Replication(factor, min_insync)


def test_replication_settings_are_checked() -> None:
    chosen = Settings(replication_factor=2, min_insync_replicas=2)
    assert Replication.for_cluster(chosen, 3) == Replication(2, 2)
    with pytest.raises(ConfigurationError, match="AC_REPLICATION_FACTOR=3 needs 3 brokers"):
        Replication.for_cluster(Settings(replication_factor=3), 1)
    with pytest.raises(ValueError, match="AC_MIN_INSYNC_REPLICAS=3 exceeds"):
        Settings(replication_factor=2, min_insync_replicas=3)
