"""Intercom's conversation webhook links the session it names, through the standalone
ingest (``agent-context ingest``) on a real broker."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import orjson
import pytest

from agents.ingest.intercom import conversation_link
from schemas import InvalidMessage, SessionLink
from schemas import connector as signing
from tests.support.kafka_io import read_topic
from tests.support.waiting import wait_for
from tests.support.workers import ROOT, free_port

pytestmark = pytest.mark.kafka

CLIENT_SECRET = "intercom-client-secret-test"


def notification(conversation_id: str, attributes: dict[str, object] | None) -> bytes:
    """What Intercom posts for a new conversation (``conversation.user.created``)."""
    item = {
        "type": "conversation",
        "id": conversation_id,
        "created_at": 1700000000,
        "source": {"type": "conversation", "body": "<p>Export fails</p>"},
        "custom_attributes": attributes or {},
    }
    return orjson.dumps(
        {
            "type": "notification_event",
            "app_id": "abc123",
            "topic": "conversation.user.created",
            "id": "notif_1",
            "created_at": 1700000001,
            "data": {"type": "notification_event_data", "item": item},
        }
    )


def signed(body: bytes, secret: str = CLIENT_SECRET) -> dict[str, str]:
    return {"X-Hub-Signature": signing.sign(secret, body, "sha1")}


@pytest.fixture
async def ingest(worker_env: dict[str, str], tmp_path: Path) -> AsyncIterator[str]:
    """The standalone ingest with only Intercom's webhook enabled; its base URL."""
    port = free_port()
    env = {
        **os.environ,
        **worker_env,
        "AC_INGEST_PORT": str(port),
        "AC_INTERCOM_WEBHOOK_SECRET": CLIENT_SECRET,
        "AC_INTERCOM_SESSION_ATTRIBUTE": "ac_session",
    }
    for name in ("AC_INGEST_SECRET", "AC_INGEST_ALLOW_UNSIGNED"):
        env.pop(name, None)
    with (tmp_path / "ingest.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agents.cli",
            "ingest",
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"

        async def up() -> bool:
            assert process.returncode is None, (tmp_path / "ingest.log").read_text()
            try:
                async with httpx.AsyncClient(trust_env=False) as http:
                    return (await http.get(f"{url}/healthz")).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            await wait_for(up, timeout=60, interval=0.2, message="the ingest never answered")
            yield url
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), timeout=30)


async def test_a_signed_conversation_webhook_links_its_session(
    ingest: str, worker_env: dict[str, str]
) -> None:
    body = notification("215471", {"ac_session": "ps-77", "plan": "pro"})
    async with httpx.AsyncClient(base_url=ingest, trust_env=False) as http:
        answer = await http.post("/intercom", content=body, headers=signed(body))
        assert answer.status_code == 202, answer.text
        assert answer.json()["status"] == "linked"
        # Bad or missing signatures, another secret, a changed body: 401, nothing produced.
        for headers in (
            {},
            signed(body, "another-secret"),
            signed(body + b" "),
            {"X-Hub-Signature": signing.sign(CLIENT_SECRET, body)},  # sha256: not Intercom's
        ):
            refused = await http.post("/intercom", content=body, headers=headers)
            assert refused.status_code == 401, (headers, refused.text)
        # A conversation without the attribute, and Intercom's ping: nothing to link.
        for other in (
            notification("215472", {"plan": "pro"}),
            orjson.dumps({"type": "notification_event", "topic": "ping", "data": {"item": {}}}),
        ):
            ignored = await http.post("/intercom", content=other, headers=signed(other))
            assert ignored.status_code == 200 and ignored.json()["status"] == "ignored"
        broken = b'{"type": "notification_event", "topic": '
        bad = await http.post("/intercom", content=broken, headers=signed(broken))
        assert bad.status_code == 422 and bad.json()["error"].startswith("not valid JSON")
        assert "\n" not in bad.json()["error"]
        # Only Intercom's webhook is on: the actions webhook is not served unsigned.
        actions = await http.post("/webhook", content=b"{}")
        assert actions.status_code == 404

    records = await read_topic(worker_env, "links")
    links = [(r.key, SessionLink.model_validate_json(r.value or b"")) for r in records]
    assert [(key, link.session_id, link.conversation_id) for key, link in links] == [
        (b"ps-77", "ps-77", "215471")
    ]


def test_what_a_notification_links() -> None:
    body = orjson.loads(notification("9", {"session_id": " s-1 "}))
    assert conversation_link(body, "session_id") == ("s-1", "9")
    assert conversation_link(body, "other") is None
    with pytest.raises(InvalidMessage, match="not a conversation"):
        conversation_link({"topic": "conversation.user.created", "data": {"item": []}}, "x")
    with pytest.raises(InvalidMessage, match="no id"):
        conversation_link(
            {"topic": "conversation.admin.opened", "data": {"item": {"type": "conversation"}}},
            "x",
        )
