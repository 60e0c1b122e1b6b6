"""The connector's contract (schemas.connector): one rule for what a frame is, at every way in.

Before, "is this an actions frame?" was decided four times: HTTP ingest dead-lettered
a frame without ``type``, the SSE bridge ignored it, ``produce-file`` (and re-drive)
and ``ActionsProducer.add`` accepted it as actions.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import test_utils, web
from typer.testing import CliRunner

from agents.cli import app as cli_app
from agents.ingest.http import create_ingest_app
from agents.ingest.producer import ActionsProducer
from agents.ingest.sse import SSEBridge
from schemas import DeadLetter, InvalidMessage
from schemas.connector import parse_actions, parse_frame, sign, verify
from tests.support.waiting import wait_for

#: The connector's actions frame without its ``type``: malformed, even with ``actions``.
UNTYPED = {
    "session_id": "s-untyped",
    "product_id": "p",
    "actions": [{"title": "t", "description": "Clicked Save", "canonical_url": "/x"}],
}
RAW = orjson.dumps(UNTYPED)
REASON = "missing event type"


class Recorder:
    """Stands in for ActionsProducer where only what was produced matters."""

    def __init__(self) -> None:
        self.produced: list[bytes] = []
        self.letters: list[DeadLetter] = []

    async def add_raw(self, key: str | None, value: bytes) -> None:
        self.produced.append(value)

    async def dead_letter(self, letter: DeadLetter) -> None:
        self.letters.append(letter)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[test_utils.TestServer]:
    server = test_utils.TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def http_ingest_answer() -> str:
    recorder = Recorder()
    app = create_ingest_app(recorder, secret="s3cret")
    async with serving(app) as server, test_utils.TestClient(server) as client:
        resp = await client.post(
            "/webhook", data=RAW, headers={"X-Connector-Signature": sign("s3cret", RAW)}
        )
        assert resp.status == 422, await resp.text()
        body = await resp.json()
    assert recorder.produced == []
    assert [letter.original for letter in recorder.letters] == [RAW]
    return str(body["error"])


async def sse_bridge_answer() -> str:
    done = asyncio.Event()

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b"data: " + RAW + b"\n\n")
        await done.wait()
        return resp

    app = web.Application()
    app.router.add_get("/stream", stream)
    recorder = Recorder()
    async with serving(app) as server:
        bridge = SSEBridge(recorder, url=str(server.make_url("/stream")))
        task = asyncio.create_task(bridge.run())
        try:
            await wait_for(lambda: recorder.letters, timeout=10, message="no dead letter")
        finally:
            bridge.stop()
            done.set()
            await asyncio.wait_for(task, 10)
    assert recorder.produced == []
    (letter,) = recorder.letters
    assert (letter.original, letter.key) == (RAW, "s-untyped")
    return letter.reason


def produce_file_answer(tmp_path: Path) -> str:
    path = tmp_path / "untyped.jsonl"
    path.write_bytes(RAW + b"\n")
    result = CliRunner().invoke(cli_app, ["produce-file", "--dry-run", str(path)])
    assert result.exit_code == 3, result.output
    assert "0 valid payloads (0 actions), 1 invalid" in result.output
    line = next(line for line in result.output.splitlines() if ":line 1: " in line)
    return line.split(":line 1: ", 1)[1]


async def producer_answer() -> str:
    producer = ActionsProducer(f"127.0.0.1:{closed_port()}", ack_timeout_s=2)
    with pytest.raises(InvalidMessage) as refused:
        await producer.add(UNTYPED)  # refused before any connection is tried
    return refused.value.reason


async def test_the_four_ways_in_give_one_answer_for_a_frame_without_type(
    tmp_path: Path,
) -> None:
    answers = {
        "http ingest": await http_ingest_answer(),
        "sse bridge": await sse_bridge_answer(),
        "produce-file (and re-drive)": produce_file_answer(tmp_path),
        "ActionsProducer.add": await producer_answer(),
    }
    assert answers == dict.fromkeys(answers, REASON)
    with pytest.raises(InvalidMessage, match=REASON):
        parse_actions(RAW)  # what re-drive checks a dead letter's original with


@pytest.mark.parametrize(
    ("frame", "outcome"),
    [
        ({"type": "actions", "session_id": "s", "actions": []}, "actions"),
        ({"type": "summary", "session_id": "s", "summary": "x"}, "summary"),
        ({"type": "heartbeat"}, "heartbeat"),
        (UNTYPED, "invalid: missing event type"),
        ({**UNTYPED, "type": None}, "invalid: missing event type"),
        ({**UNTYPED, "type": 3}, "invalid: event type is not a string: 3"),
        ({"type": "actions", "session_id": ""}, "invalid: "),
        ([UNTYPED], "invalid: not a JSON object: list"),
    ],
)
def test_parse_frame_classifies_by_type_alone(frame: Any, outcome: str) -> None:
    try:
        parsed = parse_frame(orjson.dumps(frame))
    except InvalidMessage as exc:
        assert f"invalid: {exc.reason}".startswith(outcome)
        return
    assert parsed.type == outcome
    assert (parsed.actions is not None) == (outcome == "actions")


def test_one_signature_scheme_signs_and_verifies() -> None:
    body = b'{"type": "actions"}'
    header = sign("k", body)
    assert header.startswith("sha256=") and verify("k", body, header)
    assert verify(b"k", body, header.upper().replace("SHA256=", "sha256="))
    assert not verify("k", body + b" ", header)
    assert not verify("other", body, header)
    assert verify("k", body, sign("k", body, "sha1"), "sha1")
    assert not verify("k", body, header, "sha1")
