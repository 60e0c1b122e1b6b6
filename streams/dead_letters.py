"""Write input that cannot be applied to the dead-letter topic, with the reason."""

from __future__ import annotations

import logging
import time

import faust
from faust.types import Message

from schemas import DeadLetter, encode
from streams import metrics

__all__ = ["DeadLetterWriter"]

log = logging.getLogger(__name__)


def reason_kind(reason: str) -> str:
    """A low-cardinality label for metrics: the reason up to its first colon."""
    return reason.split(":", 1)[0][:60]


class DeadLetterWriter:
    def __init__(self, topic: faust.TopicT, *, stage: str) -> None:
        self._topic = topic
        self._stage = stage

    async def write(self, message: Message, reason: str) -> None:
        """Produce a dead letter for ``message`` and wait for the broker's ack."""
        key = message.key.decode("utf-8", "replace") if isinstance(message.key, bytes) else None
        letter = DeadLetter(
            reason=reason,
            stage=self._stage,
            source_topic=message.topic,
            partition=message.partition,
            offset=message.offset,
            key=key,
            original_b64=DeadLetter.encode_original(message.value),
            failed_at=time.time(),
        )
        await self.write_letter(letter)

    async def write_letter(self, letter: DeadLetter) -> None:
        fut = await self._topic.send(key=letter.key or "", value=encode(letter))
        await fut
        metrics.DEAD_LETTERS.labels(self._stage, reason_kind(letter.reason)).inc()
        log.warning(
            "dead letter from %s[%d]@%d (%s): %s",
            letter.source_topic,
            letter.partition,
            letter.offset,
            self._stage,
            letter.reason,
        )
