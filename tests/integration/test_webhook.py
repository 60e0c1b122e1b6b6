"""The webhook sink: signed, keyed, retried; end to end with a deduping receiver on loopback."""

from __future__ import annotations

import asyncio
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
import pytest
from autoplay_sdk.webhook_receiver import WebhookReceiver as SdkWebhookReceiver

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import ActionsPayload, ActionsWritten, SummaryReady
from schemas.connector import sign
from sinks._http import TransientHTTPError
from sinks.base import PermanentSinkError
from sinks.context import SessionContext
from sinks.webhook import WebhookSettings, WebhookSink, idempotency_key
from streams.settings import ConfigurationError
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.support.pipeline import Pipeline, batches_by_session, expected_summary_ranges, produce
from tests.support.waiting import wait_for
from tests.support.workers import Worker

SECRET = "whsec-0123456789-not-for-production"


def written(sid: str, a: int, b: int, generation: int = 0) -> ActionsWritten:
    return ActionsWritten(
        session_id=sid,
        generation=generation,
        seq_from=a,
        seq_to=b,
        text=f"batch {a}-{b}",
        payload=ActionsPayload(session_id=sid),
        emitted_at=1.0,
    )


def summary(sid: str, to: int) -> SummaryReady:
    return SummaryReady(
        session_id=sid, seq_from=1, seq_to=to, window_from=1, summary="s", emitted_at=1.0
    )


def make_sink(url: str, **overrides: Any) -> WebhookSink:
    return WebhookSink(
        WebhookSettings(url=url, secret=SECRET, timeout_s=1.0, attempts=3, **overrides)
    )


def test_keys_are_stable_per_operation_and_unique_across_operations() -> None:
    ops = [
        written("s", 1, 3),
        written("s", 4, 6),
        summary("s", 6),
        written("s", 1, 3, generation=9),
        written("t", 1, 3),
    ]
    keys = [idempotency_key(op) for op in ops]
    assert len(set(keys)) == len(keys)
    again = ops[0].model_copy(update={"emitted_at": 99.0, "text": "re-emitted"})
    assert idempotency_key(again) == keys[0]


def test_the_signature_is_what_the_sdk_receiver_verifies() -> None:
    body = orjson.dumps({"type": "actions_written", "x": "é"})
    assert SdkWebhookReceiver(secret=SECRET).verify(body, sign(SECRET, body))
    assert not SdkWebhookReceiver(secret=SECRET).verify(body + b" ", sign(SECRET, body))


def test_settings_are_required_and_the_secret_never_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("AC_WEBHOOK_"):
            monkeypatch.delenv(key)
    with pytest.raises(ConfigurationError) as missing:
        WebhookSettings.load()
    assert "AC_WEBHOOK_URL" in str(missing.value) and "AC_WEBHOOK_SECRET" in str(missing.value)
    monkeypatch.setenv("AC_WEBHOOK_URL", "http://127.0.0.1:1/hook")
    monkeypatch.setenv("AC_WEBHOOK_SECRET", " ")
    with pytest.raises(ConfigurationError, match="AC_WEBHOOK_SECRET"):
        WebhookSettings.load()
    monkeypatch.setenv("AC_WEBHOOK_SECRET", SECRET)
    sink = WebhookSink.from_settings(None)  # type: ignore[arg-type]
    assert SECRET not in repr(sink) + repr(sink.settings)


async def test_answers_are_classified() -> None:
    async with WebhookReceiver(SECRET, retry_after_s=0.2) as receiver:
        sink = make_sink(receiver.url)
        context = SessionContext(session_id="s").advanced(written("s", 1, 2))
        receiver.fail("429", "accept-then-500")  # waited out, then redelivered: kept once
        await sink.apply(written("s", 1, 2), context)
        assert [d.status for d in receiver.deliveries] == [429, 500, 200]
        assert receiver.deliveries[2].duplicate
        assert len({d.key for d in receiver.deliveries}) == 1
        receiver.fail("400")
        with pytest.raises(PermanentSinkError) as refused:
            await sink.apply(written("s", 3, 3), context)
        assert SECRET not in str(refused.value)
        receiver.fail("503", "503", "503")
        with pytest.raises(TransientHTTPError):  # the runner retries it
            await sink.apply(written("s", 3, 3), context)
        receiver.fail("409")  # "I have this key already"
        await sink.apply(written("s", 3, 3), context)
        body = receiver.deliveries[0].body
        assert body["type"] == "actions_written" and body["operation"]["seq_to"] == 2
        assert body["context"]["text"] == context.render()
        await sink.aclose()


@pytest.mark.kafka
async def test_every_operation_arrives_signed_once_with_stable_keys(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 5
    payloads = list(interleaved_payloads(plan_sessions(12, mean_length=20, seed=8), seed=8))
    expected: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for sid, batches in batches_by_session(payloads).items():
        seq = 0
        crossings = expected_summary_ranges(batches, threshold)[sid]
        for p in batches:
            expected[sid].append(("actions_written", seq + 1, seq + len(p["actions"])))
            seq += len(p["actions"])
            if crossings and crossings[0] == seq:
                expected[sid].append(("summary_ready", 1, crossings.pop(0)))
    total = sum(len(v) for v in expected.values())

    async with WebhookReceiver(SECRET, retry_after_s=0.3) as receiver:
        env = {
            **worker_env,
            "AC_THRESHOLD": str(threshold),
            "AC_IDLE_TIMEOUT_S": "3600",
            "AC_WEBHOOK_URL": receiver.url,
            "AC_WEBHOOK_SECRET": SECRET,
            "AC_WEBHOOK_TIMEOUT_S": "1",
        }
        pipe = Pipeline(env, tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("webhook")]
        await asyncio.gather(*(w.wait_ready() for w in started))
        # Kept and then failed (a real redelivery), rate limited, failed, timed out.
        receiver.fail("accept-then-500", "ok", "429", "500", "timeout", "accept-then-500")
        await produce(pipe.env, payloads)
        await wait_for(
            lambda: len(receiver.accepted) >= total,
            timeout=90,
            interval=0.2,
            message=lambda: f"{len(receiver.accepted)}/{total} operations accepted",
        )

    assert all(d.signature_ok for d in receiver.deliveries)
    got: dict[str, list[tuple[str, int, int]]] = defaultdict(list)
    for key, delivery in receiver.accepted.items():
        op = delivery.body["operation"]
        assert key == delivery.body["idempotency_key"]
        got[op["session_id"]].append((op["op"], op["seq_from"], op["seq_to"]))
    # Every operation exactly once (keys unique per op), each session in order: raw
    # batches in sequence, summaries in sequence, each after the batches it covers.
    assert set(got) == set(expected)
    for sid, ops in got.items():
        assert sorted(ops) == sorted(expected[sid]), sid
        for kind in ("actions_written", "summary_ready"):
            assert [o for o in ops if o[0] == kind] == [o for o in expected[sid] if o[0] == kind]
        for position, (kind, _, seq_to) in enumerate(ops):
            if kind == "summary_ready":
                done = max((o[2] for o in ops[:position] if o[0] == "actions_written"), default=0)
                assert done >= seq_to, (sid, ops)
    # Redeliveries carried the key of the first delivery, for the same operation.
    assert receiver.duplicates, "no redelivery happened"
    for dup in receiver.duplicates:
        first = receiver.accepted[dup.key or ""]
        assert dup.body["operation"] == first.body["operation"]
