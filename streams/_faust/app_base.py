"""``faust.App`` with the overrides of its private methods these workers need.

``streams.app.ContextApp`` builds on it; what it changes in Faust stays here:
the consumer on the worker's loop, an idempotent producer and its aiokafka client, and a stop
that does not wait for ever for messages in progress.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any, cast

import faust
from aiokafka import AIOKafkaProducer
from faust.transport.drivers.aiokafka import Producer as AiokafkaProducer
from faust.types import ConsumerT, ProducerT, TableT

from streams._faust import divert, produce
from streams._faust.consumer import MainLoopConsumer, ThreadConsumer

__all__ = ["FaustApp"]

log = logging.getLogger(__name__)

divert.apply()  # Faust 0.15: no records lost or reordered around seeks (see the module)
produce.apply()  # aiokafka 0.14: a produce request's batches copied once, not six times


class FaustApp(faust.App):
    """Subclasses say whether the consumer runs on the loop and how a stop gives up."""

    def consumer_on_loop(self) -> bool:
        """Serve Faust's consumer on this worker's event loop (``_faust.consumer``)."""
        return True

    def stop_grace_s(self) -> float | None:
        """How long a stop waits for messages in progress; ``None``: as long as Faust does."""
        return None

    def fetch_wait(self) -> tuple[int, int] | None:
        """(bytes, ms): a fetch waits at the broker for that many bytes or that long;
        ``None``: Faust's (1 byte, 1,500 ms)."""
        return None

    async def abandon_in_progress(self, waited_s: float) -> None:
        """A stop's grace period ended with messages still in progress: cancel them."""

    async def routable(self, table: TableT[Any, Any]) -> None:
        """Faust's table router (``table_route``) hashes a key with the producer's metadata
        for the table's changelog, which a worker that has not written to it lacks: every
        routed request failed (a TypeError, a 500) until its first write, so a restarted
        sink's pull view never answered while idle. Fetched once here, as the worker
        starts (tests/integration/test_null_sink.py)."""
        topic = table.changelog_topic.get_topic_name()
        try:
            await self.aiokafka_producer().partitions_for(topic)
        except Exception as exc:  # the first write fetches it too: a warning, not a stop
            log.warning("no metadata for %s yet (%r): routed pages wait for a write", topic, exc)

    def aiokafka_producer(self) -> AIOKafkaProducer:
        """The producer's aiokafka client, for paths that skip Faust's ``Producer.send``."""
        return cast(AIOKafkaProducer, cast(Any, self.producer)._ensure_producer())

    def _new_consumer(self) -> ConsumerT:
        # The transport builds the consumer from its ``Consumer`` class.
        on_loop = self.consumer_on_loop()
        cast(Any, self.transport).Consumer = MainLoopConsumer if on_loop else ThreadConsumer
        return super()._new_consumer()

    def _new_producer(self) -> ProducerT:
        # Idempotent: a batch retried after a broker failover is written once
        # (tests/cluster/test_cluster_chaos.py).
        return IdempotentProducer(self.transport, loop=self.loop, beacon=self.beacon)

    async def _consumer_wait_empty(self, consumer: Any, logger: Any) -> None:
        """Faust's wait for messages in progress, bounded by :meth:`stop_grace_s`.

        On SIGTERM Faust waits until every message taken is acknowledged, so a sink
        whose destination is down, retrying with backoff, never stopped. After the
        grace period what is in progress is abandoned: not acknowledged, so not
        committed, and redelivered (idempotently) after the restart. Rebalances keep
        Faust's unbounded wait: a partition's work must end before another takes it.
        """
        grace = self.stop_grace_s()
        if grace is None:
            await super()._consumer_wait_empty(consumer, logger)
            return
        waiting = asyncio.ensure_future(super()._consumer_wait_empty(consumer, logger))
        done, _ = await asyncio.wait({waiting}, timeout=grace)
        if not done:
            await self.abandon_in_progress(grace)
            # Faust's wait swallows cancellation, so let it end instead: it stops
            # waiting for what was abandoned and commits what was acknowledged.
            consumer._unacked_messages.clear()
        await waiting


class IdempotentProducer(AiokafkaProducer):
    """Faust's aiokafka producer with ``enable_idempotence`` (acks=all is Faust's default)."""

    def _settings_extra(self) -> Mapping[str, Any]:
        return {**super()._settings_extra(), "enable_idempotence": True}
