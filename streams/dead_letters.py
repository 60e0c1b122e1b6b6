"""Write input that cannot be applied to the dead-letter topic, with the reason."""

from __future__ import annotations

import logging
import time

import faust
from faust.types import Message

from schemas import DeadLetter, encode
from streams.observe import metrics

__all__ = ["DeadLetterWriter", "dead_letter", "from_message"]

log = logging.getLogger(__name__)


def reason_kind(reason: str) -> str:
    """A low-cardinality label for metrics: the reason up to its first colon."""
    return reason.split(":", 1)[0][:60]


def dead_letter(
    reason: str,
    stage: str,
    original: bytes | None,
    *,
    source_topic: str,
    partition: int = -1,
    offset: int = -1,
    key: str | None = None,
) -> DeadLetter:
    """The one place a :class:`DeadLetter` is built: the original bytes kept, stamped now.
    Input that did not come from a topic (HTTP, SSE, a file) has partition -1."""
    return DeadLetter(
        reason=reason,
        stage=stage,
        source_topic=source_topic,
        partition=partition,
        offset=offset,
        key=key,
        original_b64=DeadLetter.encode_original(original),
        failed_at=time.time(),
    )


def from_message(message: Message, reason: str, stage: str, key: str | None = None) -> DeadLetter:
    """A dead letter for a consumed ``message``; its key is the message's unless given."""
    if key is None and isinstance(message.key, bytes):
        key = message.key.decode("utf-8", "replace")
    return dead_letter(
        reason,
        stage,
        message.value,
        source_topic=message.topic,
        partition=message.partition,
        offset=message.offset,
        key=key,
    )


class DeadLetterWriter:
    def __init__(self, topic: faust.TopicT, *, stage: str) -> None:
        self._topic = topic
        self._stage = stage

    async def write(self, message: Message, reason: str) -> None:
        """Produce a dead letter for ``message`` and wait for the broker's ack."""
        await self.write_letter(from_message(message, reason, self._stage))

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
