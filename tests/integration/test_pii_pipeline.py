"""The PII filter end to end: real broker, a real pipeline worker, the loopback
OpenAI-compatible server; no PII reaches any recorded prompt (AC_PII=llm, the default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents.pii import PLACEHOLDER
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.pipeline import Pipeline, produce
from tests.support.waiting import wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.kafka


async def test_no_pii_reaches_the_llm_end_to_end(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    email, phone, card, token = (
        "ann.lee@corp.io",
        "(415) 555-0132",
        "4111 1111 1111 1111",
        "t0k3nVALUE",
    )

    def action(i: int, sid: str) -> dict[str, Any]:
        texts = [f"Entered email {email}", f"Called {phone}", f"Paid with card {card}", "Opened"]
        return {
            "index": i,
            "type": "input",
            "title": texts[i % 4],
            "description": texts[(i + 1) % 4],
            "canonical_url": "https://app.example.com/reset",
            "raw_url": f"https://app.example.com/reset?access_token={token}&tab=a",
            "session_id": sid,
        }

    def payload(sid: str, first: int) -> dict[str, Any]:
        actions = [action(i, sid) for i in range(first, first + 4)]
        return {"session_id": sid, "email": email, "actions": actions}

    payloads = [payload("pii-a", 0), payload("pii-b", 0), payload("pii-a", 4)]
    async with FakeOpenAIServer() as llm:
        env = {
            **worker_env,
            "AC_THRESHOLD": "4",
            "AC_LLM_API_KEY": "sk-test-not-a-secret",
            "AC_LLM_BASE_URL": llm.base_url,
            "AC_FORMAT_ACTIONS": "tests.support.plugins:format_every_field",
            "AC_IDLE_TIMEOUT_S": "3600",
            "AC_PII_KEY": "an-e2e-test-key-0123",
        }
        pipe = Pipeline(env, tmp_path, workers)
        await pipe.start_pipeline().wait_ready()
        await produce(pipe.env, payloads)
        await wait_for(
            lambda: len(llm.completed()) >= 3,
            timeout=120,
            interval=0.5,
            message=lambda: f"{len(llm.completed())} of 3 LLM requests completed",
        )
        prompts: dict[str | None, list[str]] = {}
        for request in llm.completed():
            for value in (email, phone, card, token, "555-0132", "1111 1111"):
                assert value not in request.prompt, (value, request.prompt)
            prompts.setdefault(request.session, []).append(request.prompt)

    def emails_in(prompt: str) -> set[str]:
        return {m.group(0) for m in PLACEHOLDER.finditer(prompt) if m.group(0).startswith("<EMAIL")}

    a_first, a_second = prompts["pii-a"]
    (b_first,) = prompts["pii-b"]
    for prompt in (a_first, a_second, b_first):
        assert all(f"<{kind}_" in prompt for kind in ("EMAIL", "PHONE", "CARD", "TOKEN")), prompt
    assert len(emails_in(a_first)) == 1 and emails_in(a_first) == emails_in(a_second)
    assert emails_in(a_first) != emails_in(b_first)  # the same person, another session
