"""Topic names and declarations. Every topic is keyed by session_id and has the
same partition count, so a session lives on one partition everywhere."""

from __future__ import annotations

from dataclasses import dataclass

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError

from streams.settings import Settings

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "MESSAGE_MAX_BYTES",
    "TOPIC_NAMES",
    "Topics",
    "declare_topics",
    "ensure_topics",
]

# The largest message the service produces to its own topics: the broker's
# default limit (message.max.bytes, 1048588) minus room for the record batch.
MESSAGE_MAX_BYTES = 1_000_000
# Dead letters carry the original message base64-encoded (4/3 of its size) plus
# the reason: the dead-letter topic takes up to this much, so a message at the
# broker's limit can still be dead-lettered whole ("never dropped").
DEAD_LETTER_MAX_BYTES = 4 * 1024 * 1024

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
            NewTopic(
                settings.topic(n),
                num_partitions=settings.partitions,
                replication_factor=1,
                topic_configs=(
                    {"max.message.bytes": str(DEAD_LETTER_MAX_BYTES)} if n == DEAD_LETTERS else {}
                ),
            )
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
