"""``ActionsProducer``: the ingest side's way into the ``actions`` topic.

A drop-in for the SDK's callbacks (``client.on_actions(producer.add)``): every
payload is checked with :func:`schemas.connector.parse_frame`, produced keyed by
``session_id`` and acknowledged by the broker (``acks=all``, idempotent) before ``add`` returns.
Awaiting the acknowledgement is the backpressure: a slow or absent broker slows
the caller down or makes it fail loudly, it never silently drops a payload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, Self, runtime_checkable

import orjson
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from aiokafka.structs import RecordMetadata
from pydantic import BaseModel

from schemas import DeadLetter, EraseRequest, InvalidMessage, SessionLink, decode, encode
from schemas.connector import ACTIONS as ACTIONS_FRAME
from schemas.connector import parse_actions, session_hint
from streams.dead_letters import dead_letter
from streams.errors import AgentContextError
from streams.partitions import default_partitioner
from streams.settings import Settings
from streams.topics import ACTIONS, DEAD_LETTERS, LINKS, MESSAGE_MAX_BYTES

__all__ = [
    "ActionsProducer",
    "DeadLetterTarget",
    "ProduceError",
    "RawActionsWriter",
    "dead_letter_writer",
    "input_dead_letter",
]

log = logging.getLogger(__name__)


class ProduceError(AgentContextError, RuntimeError):
    """The broker did not acknowledge a message (unreachable, timed out, rejected)."""


@runtime_checkable
class RawActionsWriter(Protocol):
    """What the HTTP ingest and the SSE bridge need: produce validated bytes by key."""

    async def add_raw(self, key: str | None, value: bytes) -> Any: ...


@runtime_checkable
class SupportsDeadLetter(Protocol):
    async def dead_letter(self, letter: DeadLetter) -> Any: ...


DeadLetterTarget = Callable[[DeadLetter], Awaitable[Any]] | SupportsDeadLetter


def dead_letter_writer(target: DeadLetterTarget) -> Callable[[DeadLetter], Awaitable[Any]]:
    """Accept either an async callable or an object with ``dead_letter()`` (a producer)."""
    if isinstance(target, SupportsDeadLetter):
        return target.dead_letter
    if callable(target):
        return target
    raise TypeError(f"dead letters need an async callable or a producer, got {target!r}")


def input_dead_letter(
    original: bytes, reason: str, *, stage: str, source: str, offset: int = -1
) -> DeadLetter:
    """The dead letter of an input read from no topic (HTTP, SSE, a file's line
    ``offset``), keyed by the session it names."""
    key = session_hint(original)
    return dead_letter(reason, stage, original, source_topic=source, offset=offset, key=key)


class ActionsProducer:
    """Validating, acknowledged producer for the ``actions`` (``links``, ``dead-letters``) topics.

    The Kafka connection is made on :meth:`start` or lazily on the first send, and
    retried on the next send if it failed: an ingest process can come up while
    the broker is down and answer "unavailable" until it is back.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        *,
        actions_topic: str = ACTIONS,
        dead_letters_topic: str = DEAD_LETTERS,
        links_topic: str = LINKS,
        linger_ms: int = 5,
        request_timeout_ms: int = 10_000,
        ack_timeout_s: float = 10.0,
        client_id: str = "agent-context-ingest",
    ) -> None:
        if ack_timeout_s <= 0:
            raise ValueError(f"ack_timeout_s must be > 0, got {ack_timeout_s!r}")
        self.actions_topic = actions_topic
        self.dead_letters_topic = dead_letters_topic
        self.links_topic = links_topic
        self._bootstrap = bootstrap_servers
        self._linger_ms = linger_ms
        self._request_timeout_ms = request_timeout_ms
        self._ack_timeout_s = ack_timeout_s
        self._client_id = client_id
        self._producer: AIOKafkaProducer | None = None
        self._start_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_settings(cls, settings: Settings, **options: Any) -> Self:
        return cls(
            settings.kafka_bootstrap_servers,
            actions_topic=settings.topic(ACTIONS),
            dead_letters_topic=settings.topic(DEAD_LETTERS),
            links_topic=settings.topic(LINKS),
            **options,
        )

    @property
    def connected(self) -> bool:
        return self._producer is not None

    async def start(self) -> None:
        """Connect now (optional: sends connect lazily). Raises :class:`ProduceError`."""
        self._closed = False
        try:
            async with asyncio.timeout(self._ack_timeout_s):
                await self._ensure_started()
        except TimeoutError as exc:
            raise ProduceError(f"Kafka not reachable within {self._ack_timeout_s:g}s") from exc
        except (KafkaError, OSError) as exc:
            raise ProduceError(f"Kafka not reachable: {type(exc).__name__}") from exc

    async def stop(self) -> None:
        """Flush what is pending and disconnect."""
        self._closed = True
        async with self._start_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.stop()

    async def add(self, payload: Any) -> RecordMetadata:
        """Validate and produce one actions payload; return once the broker acknowledged it.

        Accepts the SDK's ``ActionsPayload`` dataclass, our ``schemas.ActionsPayload``
        or a dict frame, which needs ``"type": "actions"`` like any frame. Raises
        :class:`schemas.InvalidMessage` for an invalid payload (nothing is produced)
        and :class:`ProduceError` if the broker does not acknowledge it in time.
        """
        try:
            raw = orjson.dumps(_as_frame(payload))
        except orjson.JSONEncodeError as exc:
            raise InvalidMessage(f"not JSON-serialisable: {exc}") from None
        if len(raw) > MESSAGE_MAX_BYTES:  # the broker's refusal would not say the sizes
            raise InvalidMessage(
                f"payload too large: {len(raw)} bytes, over the {MESSAGE_MAX_BYTES}-byte "
                "message limit; send its actions in smaller batches"
            )
        payload = parse_actions(raw)  # raises InvalidMessage with a readable reason
        return await self.add_raw(payload.session_id, raw)

    async def add_raw(self, key: str | None, value: bytes) -> RecordMetadata:
        """Produce already validated bytes to the ``actions`` topic, keyed by ``key``."""
        return await self._send(self.actions_topic, key, value)

    async def link(
        self, session_id: str, conversation_id: str, *, linked_at: float | None = None
    ) -> RecordMetadata:
        """Tie a session to a conversation (the ``links`` topic, keyed by session).

        Raises :class:`schemas.InvalidMessage` for an empty id (nothing is produced)
        and :class:`ProduceError` if the broker does not acknowledge it in time.
        """
        when = time.time() if linked_at is None else linked_at
        raw = orjson.dumps(
            {"session_id": session_id, "conversation_id": conversation_id, "linked_at": when}
        )
        link = decode(SessionLink, raw)  # raises InvalidMessage with a readable reason
        return await self._send(self.links_topic, link.session_id, raw)

    async def erase(self, session_id: str, *, reason: str = "") -> RecordMetadata:
        """Ask every stage to forget a session (an erase request on ``actions``, keyed by
        the session, so it comes after everything produced for it before)."""
        request = EraseRequest(session_id=session_id, requested_at=time.time(), reason=reason)
        return await self._send(self.actions_topic, session_id, request.model_dump_json().encode())

    async def send_raw(self, topic: str, key: str | None, value: bytes) -> RecordMetadata:
        """Produce bytes to ``topic`` (a full name), acknowledged: for re-drives."""
        return await self._send(topic, key, value)

    async def dead_letter(self, letter: DeadLetter) -> RecordMetadata:
        """Produce a dead letter and wait for the acknowledgement."""
        return await self._send(self.dead_letters_topic, letter.key, encode(letter))

    async def _send(self, topic: str, key: str | None, value: bytes) -> RecordMetadata:
        if self._closed:
            raise ProduceError("producer is stopped")
        # The key's utf-8 bytes go through Kafka's default (murmur2) partitioner, the
        # same one Faust uses: a session lands on one partition in every topic.
        key_bytes = key.encode("utf-8") if key is not None else None
        try:
            async with asyncio.timeout(self._ack_timeout_s):
                producer = await self._ensure_started()
                # send() only enqueues, so concurrent calls share a batch; the ack
                # is awaited per message.
                future = await producer.send(topic, value=value, key=key_bytes)
                return await future
        except TimeoutError as exc:
            raise ProduceError(
                f"no acknowledgement from Kafka for {topic} within {self._ack_timeout_s:g}s"
            ) from exc
        except (KafkaError, OSError) as exc:
            raise ProduceError(f"producing to {topic} failed: {type(exc).__name__}") from exc

    async def _ensure_started(self) -> AIOKafkaProducer:
        if self._producer is not None:
            return self._producer
        async with self._start_lock:
            if self._producer is not None:
                return self._producer
            producer = AIOKafkaProducer(
                bootstrap_servers=self._bootstrap,
                client_id=self._client_id,
                acks="all",
                enable_idempotence=True,  # a retried batch is not written twice
                linger_ms=self._linger_ms,
                request_timeout_ms=self._request_timeout_ms,
                partitioner=default_partitioner,  # aiokafka's, compiled where built
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()  # close the half-open client; next send retries
                raise
            self._producer = producer
            log.info("Kafka producer connected to %s", self._bootstrap)
            return producer


def _as_frame(payload: Any) -> Any:
    """A typed payload becomes an actions frame; a mapping is a frame as it is."""
    if isinstance(payload, BaseModel):
        return {"type": ACTIONS_FRAME, **payload.model_dump(mode="json")}
    if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
        if not hasattr(payload, "actions"):  # e.g. the SDK's SummaryPayload
            raise InvalidMessage(f"not an actions payload: {type(payload).__name__}")
        return {"type": ACTIONS_FRAME, **dataclasses.asdict(payload)}
    if isinstance(payload, Mapping):
        return dict(payload)
    raise InvalidMessage(f"an actions payload must be an object, got {type(payload).__name__}")
