"""Who can read a session: the web servers bind the configured host, session data needs
the API token, and Faust's own table browser is off (docs: README "Privacy and access")."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from streams.settings import ConfigurationError, Settings, from_environment
from tests.support.pipeline import Pipeline, produce
from tests.support.waiting import wait_for
from tests.support.workers import Worker

TOKEN = "api-T0KEN-not-a-real-secret"


def test_a_bind_beyond_loopback_needs_a_token(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AC_WEB_HOST", "0.0.0.0")
    with pytest.raises(ConfigurationError) as refused:
        from_environment(Settings)
    assert str(refused.value) == (
        "AC_WEB_HOST=0.0.0.0 serves session data beyond this machine: set AC_API_TOKEN "
        "(clients send it as a bearer token), or AC_ALLOW_UNAUTHENTICATED=true"
    )
    monkeypatch.setenv("AC_API_TOKEN", TOKEN)
    assert from_environment(Settings).web_host == "0.0.0.0"
    monkeypatch.delenv("AC_API_TOKEN")
    monkeypatch.setenv("AC_ALLOW_UNAUTHENTICATED", "true")
    assert from_environment(Settings).allow_unauthenticated


def listening_addresses(port: int) -> set[str]:
    """The local addresses with a listening TCP socket on ``port`` (what ``ss -ltn`` shows)."""
    found = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, port_hex = local.split(":")
            if state == "0A" and int(port_hex, 16) == port:  # 0A: LISTEN
                if width == 8:
                    found.add(".".join(str(b) for b in reversed(bytes.fromhex(address))))
                else:
                    found.add(address)
    return found


@pytest.mark.kafka
async def test_session_data_needs_the_token_and_nothing_listens_beyond_the_host(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """The old workers listened on 0.0.0.0 and answered the pull view (and Faust's
    /table/ browser) to anyone, with no credential."""
    pipe = Pipeline({**worker_env, "AC_API_TOKEN": TOKEN}, tmp_path, workers)
    pipeline, sink = pipe.start_pipeline(), pipe.start_sink("files")
    await asyncio.gather(pipeline.wait_ready(), sink.wait_ready())
    secret_email = "jane.doe@example.com"
    await produce(
        pipe.env,
        [{"session_id": "s-1", "email": secret_email, "actions": [{"description": "x"}]}],
    )
    good = {"Authorization": f"Bearer {TOKEN}"}
    url = f"{sink.url}/sessions/s-1/context"
    async with httpx.AsyncClient(timeout=10) as client:

        async def applied() -> bool:
            response = await client.get(url, headers=good)
            return response.status_code == 200 and response.json()["actions_applied"] == 1

        await wait_for(applied, timeout=60, message="the session at the sink")
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
            refused = await client.get(url, headers=headers)
            assert refused.status_code == 401, headers
            assert "s-1" not in refused.text and "actions" not in refused.json()
        for worker in (pipeline, sink):
            assert (await client.get(f"{worker.url}/healthz")).status_code == 200
            assert (await client.get(f"{worker.url}/metrics")).status_code == 200
            # Faust's table browser served every table's values (sessions' actions).
            for path in ("/table/", "/router/"):
                assert (await client.get(f"{worker.url}{path}")).status_code == 404, path
            assert listening_addresses(worker.web_port) == {"127.0.0.1"}
