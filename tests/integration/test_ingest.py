"""Ingest side: the SDK client, the HTTP webhook endpoint and the SSE bridge -> Kafka.

Everything is real: a Kafka broker, aiohttp servers on 127.0.0.1, and what
landed is checked by consuming the topics.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord
from autoplay_sdk import AsyncConnectorClient

from agents.ingest.http import create_ingest_app
from agents.ingest.producer import ActionsProducer, ProduceError
from agents.ingest.sse import SSEBridge, SSEBridgeFatal
from schemas import ActionsPayload, DeadLetter, InvalidMessage, decode
from schemas.connector import SIGNATURE_HEADER, sign
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.kafka_io import delete_topics_at_the_end
from tests.support.waiting import wait_for

pytestmark = pytest.mark.kafka

SECRET = "whsec-test-secret"
TOKEN = "uk_test_bearer_token_123"


# --------------------------------------------------------------------------- helpers


def actions_event(session_id: str, n: int = 2, **extra: Any) -> dict[str, Any]:
    actions = [
        {
            "title": f"Step {i}",
            "description": f"User did step {i}",
            "canonical_url": "https://app.example.com/projects/:id",
            "index": i,
            "type": "click",
            "timestamp_start": 1700000000.0 + i,
            "timestamp_end": 1700000000.5 + i,
            "raw_url": "https://app.example.com/projects/42",
            "session_id": session_id,
        }
        for i in range(n)
    ]
    return {
        "type": "actions",
        "product_id": "prod-1",
        "session_id": session_id,
        "user_id": "user-1",
        "email": None,
        "actions": actions,
        "count": n,
        "forwarded_at": time.time(),
        **extra,
    }


def frame(data: dict[str, Any] | str, event: str | None = None) -> bytes:
    text = data if isinstance(data, str) else orjson.dumps(data).decode()
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


HEARTBEAT = frame({"type": "heartbeat"}, event="heartbeat")


def closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serve(app: web.Application) -> AsyncIterator[str]:
    """Run ``app`` on 127.0.0.1 (a free port); yield its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


async def partition_ends(settings: Settings, name: str) -> dict[int, int]:
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await consumer.start()
    try:
        parts = [TopicPartition(settings.topic(name), p) for p in range(settings.partitions)]
        ends = await consumer.end_offsets(parts)
        return {tp.partition: offset for tp, offset in ends.items()}
    finally:
        await consumer.stop()


async def topic_size(settings: Settings, name: str) -> int:
    return sum((await partition_ends(settings, name)).values())


async def read_topic(
    settings: Settings, name: str, count: int, within_s: float = 30.0
) -> list[ConsumerRecord]:
    """Wait until ``count`` records are in the topic, read them; fail if there are more."""
    await wait_for(
        lambda: _at_least(settings, name, count),
        timeout=within_s,
        message=f"{count} records in {settings.topic(name)}",
    )
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        parts = [TopicPartition(settings.topic(name), p) for p in range(settings.partitions)]
        consumer.assign(parts)
        await consumer.seek_to_beginning(*parts)
        records: list[ConsumerRecord] = []
        deadline = time.monotonic() + within_s
        while len(records) < count and time.monotonic() < deadline:
            for batch in (await consumer.getmany(timeout_ms=200)).values():
                records.extend(batch)
    finally:
        await consumer.stop()
    assert len(records) == count, f"expected {count} records, read {len(records)}"
    assert await topic_size(settings, name) == count, "more records than expected"
    return records


async def _at_least(settings: Settings, name: str, count: int) -> bool:
    return await topic_size(settings, name) >= count


def expected_partition(session_id: str, partitions: int) -> int:
    """The Java-compatible murmur2 default partitioner (also what Faust's producer uses)."""
    key = session_id.encode()
    return int(DefaultPartitioner()(key, list(range(partitions)), list(range(partitions))))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
async def settings(kafka_bootstrap: str) -> AsyncIterator[Settings]:
    tag = uuid.uuid4().hex[:8]
    s = Settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix=f"t{tag}.", partitions=4)
    await ensure_topics(s)
    yield s
    env = {
        "KAFKA_BOOTSTRAP_SERVERS": kafka_bootstrap,
        "AC_TOPIC_PREFIX": s.topic_prefix,
        "AC_APP_ID": f"test-{tag}",
    }
    await delete_topics_at_the_end(env)


@pytest.fixture
async def producer(settings: Settings) -> AsyncIterator[ActionsProducer]:
    async with ActionsProducer.from_settings(settings, linger_ms=2) as p:
        yield p


@asynccontextmanager
async def ingest_server(producer: Any, **options: Any) -> AsyncIterator[httpx.AsyncClient]:
    options.setdefault("secret", SECRET)
    app = create_ingest_app(producer, **options)
    async with serve(app) as url, httpx.AsyncClient(base_url=url, trust_env=False) as http:
        yield http


def signed(body: bytes, secret: str = SECRET) -> dict[str, str]:
    return {SIGNATURE_HEADER: sign(secret, body), "Content-Type": "application/json"}


# --------------------------------------------------------------------------- SSE server

Script = Callable[[web.Request, "SSEServer"], Awaitable[web.StreamResponse]]


class SSEServer:
    """A loopback connector stream: connection *i* runs ``scripts[i]`` (the last repeats)."""

    def __init__(self, scripts: list[Script]) -> None:
        self.scripts = scripts
        self.connections = 0
        self.authorizations: list[str | None] = []
        self.closing = asyncio.Event()
        self.app = web.Application()
        self.app.router.add_get("/stream/prod-1", self._handle)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        index = self.connections
        self.connections += 1
        self.authorizations.append(request.headers.get("Authorization"))
        script = self.scripts[min(index, len(self.scripts) - 1)]
        return await script(request, self)

    @asynccontextmanager
    async def running(self) -> AsyncIterator[str]:
        async with serve(self.app) as url:
            try:
                yield f"{url}/stream/prod-1"
            finally:
                self.closing.set()  # let held-open streams end before the runner cleans up


async def _open(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    return resp


def send_then_close(frames: list[bytes]) -> Script:
    async def script(request: web.Request, server: SSEServer) -> web.StreamResponse:
        resp = await _open(request)
        for chunk in frames:
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    return script


def send_then_hold(frames: list[bytes], heartbeat_s: float = 0.2) -> Script:
    async def script(request: web.Request, server: SSEServer) -> web.StreamResponse:
        resp = await _open(request)
        for chunk in frames:
            await resp.write(chunk)
        while not server.closing.is_set():
            await resp.write(HEARTBEAT)
            try:
                await asyncio.wait_for(server.closing.wait(), heartbeat_s)
            except TimeoutError:
                pass
        return resp

    return script


def send_then_drop(frames: list[bytes]) -> Script:
    async def script(request: web.Request, server: SSEServer) -> web.StreamResponse:
        resp = await _open(request)
        for chunk in frames:
            await resp.write(chunk)
        assert request.transport is not None
        request.transport.close()  # no terminating chunk: the client sees a broken stream
        return resp

    return script


def stall() -> Script:
    async def script(request: web.Request, server: SSEServer) -> web.StreamResponse:
        resp = await _open(request)  # headers go out, then nothing at all
        await server.closing.wait()
        return resp

    return script


def answer(status: int) -> Script:
    async def script(request: web.Request, server: SSEServer) -> web.StreamResponse:
        return web.json_response({"detail": "unauthorized"}, status=status)

    return script


# --------------------------------------------------------------------------- SDK client


async def test_sdk_client_on_actions_lands_every_event_keyed_by_session(
    settings: Settings, producer: ActionsProducer
) -> None:
    sessions = {"sess-alpha": 3, "sess-beta": 2, "sess-gamma": 1}
    events = [actions_event(sid, n=i + 1) for sid, times in sessions.items() for i in range(times)]
    summary = {"type": "summary", "session_id": "sess-alpha", "summary": "x", "replaces": 3}
    frames = [HEARTBEAT, *(frame(e) for e in events[:3]), frame(summary), HEARTBEAT]
    frames += [frame(e) for e in events[3:]]
    server = SSEServer([send_then_close(frames), send_then_hold([])])

    async with server.running() as url:
        client = AsyncConnectorClient(
            url=url, token=TOKEN, initial_backoff_s=0.1, max_backoff_s=0.2
        )
        client.on_actions(producer.add)
        task = client.run_in_background()
        try:
            records = await read_topic(settings, "actions", len(events))
        finally:
            # stop() is only checked when the next frame arrives: the held-open
            # second connection sends heartbeats, so run() returns promptly.
            client.stop()
            await asyncio.wait_for(task, 10)

    assert server.authorizations[0] == f"Bearer {TOKEN}"
    by_session: dict[str, list[ConsumerRecord]] = {}
    for record in records:
        assert record.key is not None
        payload = decode(ActionsPayload, record.value)
        assert record.key.decode() == payload.session_id
        by_session.setdefault(payload.session_id, []).append(record)
    assert {sid: len(rs) for sid, rs in by_session.items()} == sessions

    # One session, one partition: the murmur2 default partitioner on the utf-8 key,
    # the same partition a plain (or Faust's) aiokafka producer picks for that key.
    other = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await other.start()
    try:
        meta = await other.send_and_wait(settings.topic("actions"), b"{}", key=b"sess-alpha")
    finally:
        await other.stop()
    for sid, rs in by_session.items():
        assert {r.partition for r in rs} == {expected_partition(sid, settings.partitions)}
    assert {r.partition for r in by_session["sess-alpha"]} == {meta.partition}
    # Order within a session is kept: the batch sizes were sent as 1, 2, 3.
    alpha = sorted(by_session["sess-alpha"], key=lambda r: r.offset)
    assert [len(decode(ActionsPayload, r.value).actions) for r in alpha] == [1, 2, 3]


async def test_producer_add_accepts_sdk_model_and_dict_and_rejects_invalid(
    settings: Settings, producer: ActionsProducer
) -> None:
    from autoplay_sdk import ActionsPayload as SdkActionsPayload

    event = actions_event("sess-x")
    await producer.add(SdkActionsPayload.from_dict(event))
    await producer.add(ActionsPayload.model_validate(event))
    meta = await producer.add(event)
    assert meta.topic == settings.topic("actions")
    with pytest.raises(InvalidMessage, match="session_id"):
        await producer.add({**event, "session_id": None})
    with pytest.raises(InvalidMessage, match="not an actions payload"):
        await producer.add({**event, "type": "summary"})
    records = await read_topic(settings, "actions", 3)
    assert {r.key for r in records} == {b"sess-x"}


# --------------------------------------------------------------------------- HTTP ingest


async def test_ingest_valid_signed_posts_land_in_kafka(
    settings: Settings, producer: ActionsProducer
) -> None:
    bodies = [orjson.dumps(actions_event(sid)) for sid in ("s-1", "s-2", "s-1")]
    async with ingest_server(producer) as http:
        for body in bodies:
            resp = await http.post("/webhook", content=body, headers=signed(body))
            assert resp.status_code == 202, resp.text
            assert resp.json()["status"] == "accepted"
        assert (await http.get("/healthz")).json()["status"] == "ok"

    records = await read_topic(settings, "actions", 3)
    assert sorted(r.value for r in records) == sorted(bodies)  # the original bytes
    assert sorted(r.key for r in records) == [b"s-1", b"s-1", b"s-2"]
    s1 = {r.partition for r in records if r.key == b"s-1"}
    assert s1 == {expected_partition("s-1", settings.partitions)}


async def test_ingest_rejects_bad_or_missing_signature(
    settings: Settings, producer: ActionsProducer
) -> None:
    body = orjson.dumps(actions_event("s-1"))
    async with ingest_server(producer) as http:
        for headers in (
            {},
            {SIGNATURE_HEADER: "sha256=" + "0" * 64},
            {SIGNATURE_HEADER: sign("another-secret", body)},
            {SIGNATURE_HEADER: sign(SECRET, body + b" ")},
            {SIGNATURE_HEADER: sign(SECRET, body)[len("sha256=") :]},
        ):
            resp = await http.post("/webhook", content=body, headers=headers)
            assert resp.status_code == 401, (headers, resp.text)
    # The ingest answers only after Kafka acknowledged, so nothing can still be in flight.
    assert await topic_size(settings, "actions") == 0
    assert await topic_size(settings, "dead-letters") == 0


async def test_ingest_rejects_oversize_bodies(
    settings: Settings, producer: ActionsProducer
) -> None:
    body = orjson.dumps(actions_event("s-1", n=40))
    assert len(body) > 1024

    async def chunked() -> AsyncIterator[bytes]:  # no Content-Length: the read size counts
        for i in range(0, len(body), 256):
            yield body[i : i + 256]

    async with ingest_server(producer, max_body_bytes=1024) as http:
        resp = await http.post("/webhook", content=body, headers=signed(body))
        assert resp.status_code == 413
        resp = await http.post("/webhook", content=chunked(), headers=signed(body))
        assert resp.status_code == 413
        small = orjson.dumps(actions_event("s-1", n=1))
        resp = await http.post("/webhook", content=small, headers=signed(small))
        assert resp.status_code == 202
    records = await read_topic(settings, "actions", 1)
    assert records[0].value == small


async def test_ingest_dead_letters_malformed_and_invalid_payloads(
    settings: Settings, producer: ActionsProducer
) -> None:
    broken = b'{"type": "actions", "session_id": "s-1", "actions": ['
    no_session = orjson.dumps({**actions_event("s-2"), "session_id": ""})
    summary = orjson.dumps({"type": "summary", "session_id": "s-1", "summary": "..."})
    async with ingest_server(producer) as http:
        resp = await http.post("/webhook", content=broken, headers=signed(broken))
        assert resp.status_code == 422
        assert "not valid JSON" in resp.json()["error"]
        resp = await http.post("/webhook", content=no_session, headers=signed(no_session))
        assert resp.status_code == 422
        assert "session_id" in resp.json()["error"]
        resp = await http.post("/webhook", content=summary, headers=signed(summary))
        assert resp.status_code == 202
        assert resp.json()["status"] == "ignored"

    letters = [
        DeadLetter.model_validate_json(r.value)
        for r in await read_topic(settings, "dead-letters", 2)
    ]
    assert sorted(letter.original for letter in letters) == sorted([broken, no_session])
    for letter in letters:
        assert (letter.stage, letter.source_topic, letter.partition, letter.offset) == (
            "ingest",
            "http",
            -1,
            -1,
        )
    assert await topic_size(settings, "actions") == 0


async def test_an_oversized_payload_is_refused_with_its_size_and_the_limit() -> None:
    """The old code sent it and reported the broker's refusal as a bare exception name."""
    producer = ActionsProducer(
        f"127.0.0.1:{closed_port()}", actions_topic="a", dead_letters_topic="d"
    )
    huge = {"session_id": "s", "actions": [{"description": "x" * 1_100_000}]}
    with pytest.raises(InvalidMessage) as refused:
        await producer.add(huge)
    assert refused.value.reason.startswith("payload too large: 1100")
    assert "over the 1000000-byte message limit" in refused.value.reason
    assert not producer.connected  # refused before any connection: nothing was produced


async def test_ingest_answers_503_when_kafka_is_unreachable(settings: Settings) -> None:
    down = ActionsProducer(
        f"127.0.0.1:{closed_port()}",
        actions_topic=settings.topic("actions"),
        dead_letters_topic=settings.topic("dead-letters"),
        request_timeout_ms=500,
        ack_timeout_s=2.0,
    )
    with pytest.raises(ProduceError):
        await down.start()
    body = orjson.dumps(actions_event("s-1"))
    broken = b"{nope"
    try:
        async with ingest_server(down, produce_timeout_s=3.0, manage_producer=True) as http:
            started = time.monotonic()
            resp = await http.post("/webhook", content=body, headers=signed(body))
            assert resp.status_code == 503, resp.text
            assert time.monotonic() - started < 10
            # An invalid payload that cannot be dead-lettered is not acknowledged either.
            resp = await http.post("/webhook", content=broken, headers=signed(broken))
            assert resp.status_code == 503
            health = (await http.get("/healthz")).json()
            assert health == {"status": "ok", "kafka_connected": False}
    finally:
        await down.stop()


async def test_ingest_answers_503_when_the_produce_is_not_acknowledged(
    kafka_bootstrap: str,
) -> None:
    # A reachable broker, but the topic does not exist (auto-creation is off):
    # the produce waits for metadata and times out.
    missing = Settings(kafka_bootstrap_servers=kafka_bootstrap, topic_prefix="absent-topic-")
    producer = ActionsProducer.from_settings(missing, request_timeout_ms=1000, ack_timeout_s=2.0)
    await producer.start()
    try:
        async with ingest_server(producer, produce_timeout_s=3.0) as http:
            body = orjson.dumps(actions_event("s-1"))
            resp = await http.post("/webhook", content=body, headers=signed(body))
            assert resp.status_code == 503, resp.text
    finally:
        await producer.stop()


def test_ingest_refuses_an_empty_secret() -> None:
    with pytest.raises(ValueError, match="empty webhook secret"):
        create_ingest_app(object(), secret="", dead_letters=lambda _: None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- SSE bridge


@asynccontextmanager
async def running_bridge(bridge: SSEBridge) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(bridge.run())
    try:
        yield task
    finally:
        bridge.stop()
        await asyncio.wait_for(task, 10)


async def test_bridge_delivers_events_and_dead_letters_bad_frames(
    settings: Settings, producer: ActionsProducer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    events = [actions_event("b-1"), actions_event("b-2"), actions_event("b-1", n=3)]
    bad_json = "{not json"
    no_session = orjson.dumps({**actions_event("b-3"), "session_id": None}).decode()
    frames = [
        HEARTBEAT,
        frame(events[0]),
        frame(bad_json),
        frame({"type": "summary", "session_id": "b-1", "summary": "s"}),
        frame(events[1]),
        frame(no_session),
        frame(events[2]),
    ]
    server = SSEServer([send_then_hold(frames)])
    async with server.running() as url:
        bridge = SSEBridge(producer, url=url, token=TOKEN, initial_backoff_s=0.05)
        async with running_bridge(bridge):
            records = await read_topic(settings, "actions", 3)
            letters = await read_topic(settings, "dead-letters", 2)

    assert sorted(r.value for r in records) == sorted(orjson.dumps(e) for e in events)
    assert sorted(r.key for r in records) == [b"b-1", b"b-1", b"b-2"]
    originals = {DeadLetter.model_validate_json(r.value).original for r in letters}
    assert originals == {bad_json.encode(), no_session.encode()}
    assert server.authorizations == [f"Bearer {TOKEN}"]
    assert bridge.connections == 1
    assert TOKEN not in caplog.text
    assert TOKEN not in repr(bridge)


async def test_bridge_reconnects_after_the_server_drops_the_connection(
    settings: Settings, producer: ActionsProducer
) -> None:
    first = [actions_event("r-1"), actions_event("r-2")]
    second = [actions_event("r-1", n=5), actions_event("r-3")]
    server = SSEServer(
        [send_then_drop([frame(e) for e in first]), send_then_hold([frame(e) for e in second])]
    )
    async with server.running() as url:
        bridge = SSEBridge(producer, url=url, token=TOKEN, initial_backoff_s=0.05)
        async with running_bridge(bridge):
            records = await read_topic(settings, "actions", 4)
    assert sorted(r.value for r in records) == sorted(orjson.dumps(e) for e in first + second)
    assert server.connections >= 2
    assert bridge.connections >= 2


async def test_bridge_hooks_fire_once_per_connection_and_per_drop_in_order(
    settings: Settings, producer: ActionsProducer
) -> None:
    # Two drops, then a held stream: connect/drop twice, connect, and "stopped" at the end.
    batches = [[actions_event("h-1")], [actions_event("h-2")], [actions_event("h-3")]]
    server = SSEServer(
        [
            send_then_drop([frame(e) for e in batches[0]]),
            send_then_drop([frame(e) for e in batches[1]]),
            send_then_hold([frame(e) for e in batches[2]]),
        ]
    )
    events: list[tuple[str, ...]] = []

    def on_connect() -> None:  # the SDK's hook takes no argument
        events.append(("connect",))

    async def on_disconnect(reason: str) -> None:  # ours may take the reason, async too
        events.append(("disconnect", reason))
        raise RuntimeError("a hook that raises does not stop the bridge")

    async with server.running() as url:
        bridge = SSEBridge(
            producer,
            url=url,
            token=TOKEN,
            initial_backoff_s=0.05,
            on_connect=on_connect,
            on_disconnect=on_disconnect,
        )
        async with running_bridge(bridge):
            await read_topic(settings, "actions", 3)
            await wait_for(lambda: len(events) >= 5, message=lambda: str(events))
    kinds = [e[0] for e in events]
    assert kinds == ["connect", "disconnect"] * 3, events
    reasons = [e[1] for e in events if e[0] == "disconnect"]
    assert all(r and r != "stopped" for r in reasons[:2]), reasons
    assert reasons[2] == "stopped"
    assert bridge.connections == 3 == server.connections


async def test_bridge_401_is_fatal_without_retrying(producer: ActionsProducer) -> None:
    server = SSEServer([answer(401)])
    async with server.running() as url:
        bridge = SSEBridge(producer, url=url, token="wrong", initial_backoff_s=0.05)
        started = time.monotonic()
        with pytest.raises(SSEBridgeFatal, match="401"):
            await asyncio.wait_for(bridge.run(), 10)
        assert time.monotonic() - started < 5
    assert server.connections == 1


async def test_bridge_read_timeout_catches_a_stalled_stream(
    settings: Settings, producer: ActionsProducer
) -> None:
    events = [actions_event("st-1"), actions_event("st-2")]
    server = SSEServer([stall(), send_then_hold([frame(e) for e in events])])
    async with server.running() as url:
        bridge = SSEBridge(
            producer, url=url, token=TOKEN, read_timeout_s=0.5, initial_backoff_s=0.05
        )
        async with running_bridge(bridge):
            records = await read_topic(settings, "actions", 2)
    assert sorted(r.key for r in records) == [b"st-1", b"st-2"]
    assert bridge.read_timeouts >= 1
    assert server.connections >= 2
