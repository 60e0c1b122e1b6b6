"""Topic names and declarations. Every topic is keyed by session_id and has the
same partition count, so a session lives on one partition everywhere."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import faust
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_delay
from tenacity.wait import wait_random_exponential

from streams.settings import ConfigurationError, Settings

__all__ = [
    "DEAD_LETTER_MAX_BYTES",
    "MESSAGE_MAX_BYTES",
    "TOPIC_NAMES",
    "Replication",
    "Topics",
    "declare_topic",
    "declare_topics",
    "ensure_topics",
    "redrive_topic",
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

log = logging.getLogger(__name__)


def redrive_topic(stage: str) -> str:
    """Where ``agent-context dead-letters redrive`` sends the letters of a sink's stage
    (``sink-<name>``): only that sink's worker reads it, so no other sink sees them again."""
    return f"redrive.{stage}"


_TOPIC_CONFIG = 1  # DescribeConfigs config_source: set on the topic itself


@dataclass(frozen=True)
class Topics:
    actions: faust.TopicT
    summarize: faust.TopicT
    context: faust.TopicT
    dead_letters: faust.TopicT
    links: faust.TopicT


def declare_topic(app: faust.App, settings: Settings, name: str) -> faust.TopicT:
    """A raw-bytes topic: our agents decode themselves, so bad input can be dead-lettered."""
    return app.topic(
        settings.topic(name),
        partitions=settings.partitions,
        key_type=str,
        value_type=bytes,
        value_serializer="raw",
        key_serializer="raw",
    )


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    return Topics(*(declare_topic(app, settings, name) for name in TOPIC_NAMES))


@dataclass(frozen=True)
class Replication:
    """Copies of each new topic, and how many must have a write before it is acknowledged."""

    factor: int
    min_insync: int

    @classmethod
    def for_cluster(cls, settings: Settings, brokers: int) -> Replication:
        """``AC_REPLICATION_FACTOR`` / ``AC_MIN_INSYNC_REPLICAS``, or from the cluster's
        size: three copies where there are three brokers, two of them in sync, so one
        broker may be down and no acknowledged write is lost (tests/cluster/)."""
        factor = settings.replication_factor or max(1, min(3, brokers))
        if factor > brokers:
            raise ConfigurationError(
                f"AC_REPLICATION_FACTOR={factor} needs {factor} brokers; the cluster at "
                f"{settings.kafka_bootstrap_servers} has {brokers} running"
            )
        min_insync = settings.min_insync_replicas or (2 if factor >= 3 else 1)
        return cls(factor, min(min_insync, factor))


async def ensure_topics(
    settings: Settings, extra: Iterable[str] = (), changelogs: Iterable[str] = ()
) -> None:
    """Create the service's topics (and ``extra`` names, before the prefix; ``changelogs``,
    full names, compacted) if missing (auto-creation is off on our brokers), replicated as
    ``Replication.for_cluster`` says, and give an existing dead-letter topic the message
    limit a new one gets.

    The admin client asks a random broker of its metadata, which may be one that just
    went down: retried for up to ``AC_BROKER_WAIT_S`` (test_a_broker_down_past_the_...)."""
    retrying = AsyncRetrying(
        retry=retry_if_exception_type(KafkaError),
        stop=stop_after_delay(settings.broker_wait_s),
        wait=wait_random_exponential(multiplier=0.5, max=5),
        before_sleep=lambda state: log.warning(
            "creating topics failed (%s); retrying", state.outcome and state.outcome.exception()
        ),
        reraise=True,
    )
    async for attempt in retrying:
        with attempt:
            await _ensure_topics(settings, list(extra), list(changelogs))


async def _ensure_topics(settings: Settings, extra: list[str], changelogs: list[str]) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = {settings.topic(n): n for n in dict.fromkeys([*TOPIC_NAMES, *extra])}
        wanted.update({name: "" for name in changelogs})
        missing = [name for name in wanted if name not in existing]
        if missing:
            brokers = len((await admin.describe_cluster())["brokers"])
            replication = Replication.for_cluster(settings, brokers)
            try:
                await admin.create_topics(
                    [_new_topic(settings, name, wanted[name], replication) for name in missing]
                )
            except TopicAlreadyExistsError:
                pass  # a concurrent starter won the race
        if settings.topic(DEAD_LETTERS) in existing:
            await _raise_dead_letter_limit(admin, settings.topic(DEAD_LETTERS))
    finally:
        await admin.close()


def _new_topic(settings: Settings, name: str, short: str, replication: Replication) -> NewTopic:
    config = {"min.insync.replicas": str(replication.min_insync)}
    if short == DEAD_LETTERS:
        config["max.message.bytes"] = str(DEAD_LETTER_MAX_BYTES)
    if not short:  # a table's changelog: Faust's own would be compacted too
        config["cleanup.policy"] = "compact"
    return NewTopic(name, settings.partitions, replication.factor, topic_configs=config)


async def _raise_dead_letter_limit(admin: AIOKafkaAdminClient, name: str) -> None:
    """Raise ``max.message.bytes`` of an existing dead-letter topic (made by an older
    version, or by hand) to DEAD_LETTER_MAX_BYTES; never lower it.

    aiokafka offers only the legacy AlterConfigs, which replaces *all* of a
    topic's own settings: the others (retention, ...) are read and sent along.
    Failing (no ALTER_CONFIGS permission, say) is logged, not fatal: only dead
    letters of near-limit messages need the larger limit.
    """
    resource = ConfigResource(ConfigResourceType.TOPIC, name)
    try:
        [described] = await admin.describe_configs([resource])
        code, message, _, _, entries = described.resources[0][:5]
        if code:
            raise RuntimeError(f"describe configs: error {code} {message}")
        values = {entry[0]: entry[1] for entry in entries}
        if int(values.get("max.message.bytes") or 0) >= DEAD_LETTER_MAX_BYTES:
            return
        own: dict[str, Any] = {
            entry[0]: entry[1] for entry in entries if _set_on_topic(described, entry)
        }
        if any(value is None for value in own.values()):  # sensitive: not readable
            raise RuntimeError(f"{name} has sensitive settings that cannot be kept")
        own["max.message.bytes"] = str(DEAD_LETTER_MAX_BYTES)
        altered = await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, name, own)])
        for response in altered:
            for code, message, *_ in response.resources:
                if code:
                    raise RuntimeError(f"alter configs: error {code} {message}")
        log.info(
            "dead-letter topic %s: max.message.bytes raised to %d", name, DEAD_LETTER_MAX_BYTES
        )
    except Exception as exc:
        log.warning(
            "could not raise max.message.bytes of %s to %d (%s); a dead letter of a message "
            "near the broker's limit will fail: set it by hand",
            name,
            DEAD_LETTER_MAX_BYTES,
            exc,
        )


def _set_on_topic(response: Any, entry: Any) -> bool:
    if response.API_VERSION == 0:
        return not entry[3]  # is_default
    return bool(entry[3] == _TOPIC_CONFIG)  # config_source
