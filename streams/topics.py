"""Topic names and declarations. Every topic is keyed by session_id and has the
same partition count, so a session lives on one partition everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.settings import Settings

__all__ = ["TOPIC_NAMES", "Topics", "declare_topics", "ensure_topics"]

ACTIONS, SUMMARIZE, CONTEXT, DEAD_LETTERS, LINKS = (
    "actions",
    "summarize",
    "context",
    "dead-letters",
    "links",
)
TOPIC_NAMES = (ACTIONS, SUMMARIZE, CONTEXT, DEAD_LETTERS, LINKS)


@dataclass(frozen=True)
class Topics:
    actions: faust.TopicT
    summarize: faust.TopicT
    context: faust.TopicT
    dead_letters: faust.TopicT
    links: faust.TopicT


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    """Raw-bytes topics: our agents decode themselves, so bad input can be dead-lettered."""

    def topic(name: str) -> faust.TopicT:
        return app.topic(
            settings.topic(name),
            partitions=settings.partitions,
            key_type=str,
            value_type=bytes,
            value_serializer="raw",
            key_serializer="raw",
        )

    return Topics(*(topic(name) for name in TOPIC_NAMES))


async def ensure_topics(settings: Settings) -> None:
    """Create the service's topics if missing (auto-creation is off on our brokers)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [
            NewTopic(settings.topic(n), num_partitions=settings.partitions, replication_factor=1)
            for n in TOPIC_NAMES
            if settings.topic(n) not in existing
        ]
        if missing:
            try:
                await admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # a concurrent starter won the race
    finally:
        await admin.close()
