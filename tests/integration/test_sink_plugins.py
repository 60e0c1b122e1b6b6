"""Sinks users add without touching the project, and sinks that never hold each other back."""

from __future__ import annotations

import asyncio
import signal
from collections import defaultdict
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import ActionsPayload, ActionsWritten, SummaryReady
from sinks import registry
from sinks.base import CallbackSink
from sinks.context import SessionContext
from sinks.registry import load_sink
from streams.settings import ConfigurationError, Settings
from tests.support.pipeline import (
    Pipeline,
    batches_by_session,
    expected_summary_ranges,
    produce,
    settings_from,
)
from tests.support.sink_plugins import read_plugin_records
from tests.support.waiting import wait_for
from tests.support.workers import Worker

RECORDER = "tests.support.plugins:RecordingSink"
SLOW = "tests.support.sink_plugins:SlowSink"
SDK_MODULE = "tests.support.sdk_style_sink"


def ops(sid: str = "s") -> list[ActionsWritten | SummaryReady]:
    return [
        ActionsWritten(
            session_id=sid,
            seq_from=1,
            seq_to=2,
            text="two actions",
            payload=ActionsPayload.model_validate(
                {"session_id": sid, "actions": [{"index": 0, "type": "click"}, {"index": 1}]}
            ),
            emitted_at=0.0,
        ),
        SummaryReady(
            session_id=sid, seq_from=1, seq_to=2, window_from=1, summary="sum", emitted_at=0.0
        ),
    ]


async def drive(sink: Any) -> None:
    context = SessionContext(session_id="s")
    for op in ops():
        context = context.advanced(op)
        await sink.apply(op, context)


# --------------------------------------------------------------------------- the registry


async def test_every_plug_in_shape_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AC_PLUGIN_DIR", str(tmp_path))
    monkeypatch.setenv("AC_SLOW_SINK_DELAY_S", "0")
    settings = Settings(app_id="plugins")

    # A class with from_settings, by dotted path.
    slow = load_sink(SLOW, settings)
    assert slow.name == "slow"
    await drive(slow)
    assert [r["op"] for r in read_plugin_records(tmp_path, "slow")] == [
        "actions_written",
        "summary_ready",
    ]

    # A module with the SDK's two async functions, unchanged.
    sdk = load_sink(SDK_MODULE, settings)
    assert isinstance(sdk, CallbackSink) and sdk.name == SDK_MODULE
    await drive(sdk)
    # write_actions gets the SDK's own text; overwrite_with_summary the summary with its
    # range (and the ledger when there is one: docs/context-fidelity.md).
    assert [(r["call"], r["text"]) for r in read_plugin_records(tmp_path, "sdk")] == [
        ("write_actions", "Session s — 2 actions\n[0] click:  — \n[1] :  — "),
        ("overwrite_with_summary", "Summary of actions 1-2:\nsum"),
    ]

    # A plain synchronous pair.
    pair = load_sink("tests.support.sink_plugins:sync_pair", settings)
    await drive(pair)
    assert [r["call"] for r in read_plugin_records(tmp_path, "sync-pair")] == [
        "write_actions",
        "overwrite_with_summary",
    ]

    # A factory (settings) -> sink.
    counting = load_sink("tests.support.sink_plugins:make_counting_sink", settings)
    assert counting.name == "counting-plugins"

    # An entry point of the group ``agent_context.sinks``, by its name.
    point = EntryPoint(name="my-slow", value=SLOW, group=registry.ENTRY_POINT_GROUP)
    monkeypatch.setattr(
        registry, "entry_points", lambda group: [point] if group == point.group else []
    )
    assert load_sink("my-slow", settings).name == "slow"

    # Built-ins still win by name; a typo is a clear start-up error.
    with pytest.raises(ConfigurationError, match="cannot import"):
        load_sink("tests.support.no_such_module:Sink", settings)
    with pytest.raises(ConfigurationError, match="neither a sink"):
        load_sink("tests.support.sink_plugins:plugin_file", settings)
    # A mistyped name lists the names there are (the old code: "Empty module name").
    with pytest.raises(ConfigurationError) as unknown:
        load_sink("nosuchsink", settings)
    assert str(unknown.value) == (
        "AC_SINK='nosuchsink' is not a sink name; use one of files, intercom, my-slow, "
        "null, stdout, vector, view, webhook, or a dotted path such as mypkg.sinks:MySink"
    )


# --------------------------------------------------------------------------- end to end


def stop_all(workers: list[Worker]) -> None:
    """SIGTERM every worker at once, then wait: shutdowns overlap instead of adding up."""
    for worker in workers:
        if worker.process is not None and worker.process.poll() is None:
            worker.process.send_signal(signal.SIGTERM)
    for worker in workers:
        worker.stop()


async def group_lag(env: dict[str, str], group: str) -> int:
    """Messages of ``context`` the group has not committed yet (all of them if none)."""
    settings = settings_from(env)
    topic = settings.topic("context")
    partitions = [TopicPartition(topic, p) for p in range(settings.partitions)]
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka_bootstrap_servers)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka_bootstrap_servers)
    await admin.start()
    await consumer.start()
    try:
        committed = await admin.list_consumer_group_offsets(group, partitions=partitions)
        ends = await consumer.end_offsets(partitions)
    finally:
        await consumer.stop()
        await admin.close()
    lag = 0
    for tp in partitions:
        meta = committed.get(tp)
        done = meta.offset if meta is not None and meta.offset >= 0 else 0
        lag += ends[tp] - done
    return lag


def expected_ops(payloads: list[dict[str, Any]], threshold: int) -> dict[str, int]:
    crossings = expected_summary_ranges(payloads, threshold)
    return {sid: len(ps) + len(crossings[sid]) for sid, ps in batches_by_session(payloads).items()}


@pytest.mark.kafka
async def test_a_slow_sink_never_holds_back_another_and_plug_ins_get_everything_in_order(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 6
    payloads = list(interleaved_payloads(plan_sessions(6, mean_length=36, seed=4), seed=4))
    want = expected_ops(payloads, threshold)
    total = sum(want.values())
    plugin_dir = tmp_path / "plugins"
    env = {
        **worker_env,
        "AC_THRESHOLD": str(threshold),
        "AC_IDLE_TIMEOUT_S": "3600",
        "AC_PLUGIN_DIR": str(plugin_dir),
        "AC_SLOW_SINK_DELAY_S": "0.5",
    }
    pipe = Pipeline(env, tmp_path, workers)
    started = [
        pipe.start_pipeline(),
        pipe.start_sink(RECORDER),
        pipe.start_sink(SLOW),
        pipe.start_sink(SDK_MODULE),
    ]
    await asyncio.gather(*(w.wait_ready() for w in started))
    app_id = env["AC_APP_ID"]
    fast_group, slow_group = f"{app_id}-sink-recorder", f"{app_id}-sink-slow"
    await produce(pipe.env, payloads)

    async def fast_caught_up() -> bool:
        return len(pipe.records()) >= total and await group_lag(pipe.env, fast_group) == 0

    await wait_for(
        fast_caught_up,
        timeout=60,
        interval=0.2,
        message=lambda: f"fast sink has {len(pipe.records())}/{total}",
    )
    slow_done = len(read_plugin_records(plugin_dir, "slow"))
    slow_lag = await group_lag(pipe.env, slow_group)
    # The slow sink is still far behind while the fast one has nothing left.
    assert slow_done < total * 0.7, (slow_done, total)
    assert slow_lag > total * 0.2, (slow_lag, total)

    # The custom sink got every operation once, in order per session.
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in pipe.records():
        by_session[str(record["session_id"])].append(record)
    crossings = expected_summary_ranges(payloads, threshold)
    for sid, records in by_session.items():
        assert len(records) == want[sid], sid
        writes = [r for r in records if r["op"] == "actions_written"]
        assert [r["seq_from"] for r in writes] == [1] + [r["seq_to"] + 1 for r in writes[:-1]]
        assert [r["seq_to"] for r in records if r["op"] == "summary_ready"] == crossings[sid]
        for position, record in enumerate(records):
            if record["op"] == "summary_ready":
                done = max(r["seq_to"] for r in records[:position] if r["op"] == "actions_written")
                assert done >= record["seq_to"], sid

    # The SDK-style module: the batch texts in order, each summary after what it covers.
    def sdk_calls() -> list[dict[str, Any]]:
        return read_plugin_records(plugin_dir, "sdk")

    await wait_for(lambda: len(sdk_calls()) >= total, timeout=30, message="sdk-style sink")
    calls: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in sdk_calls():
        calls[call["session_id"]].append(call)
    for sid, batches in batches_by_session(payloads).items():
        texts = [c["text"] for c in calls[sid] if c["call"] == "write_actions"]
        assert texts == [ActionsPayload.model_validate(p).to_text() for p in batches], sid
        summaries = [c for c in calls[sid] if c["call"] == "overwrite_with_summary"]
        assert len(summaries) == len(crossings[sid]), sid
    stop_all(workers)


@pytest.mark.kafka
@pytest.mark.parametrize("builtin", ["intercom", "webhook"])
async def test_http_sinks_close_their_clients_on_stop(
    builtin: str, worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    env = {
        **worker_env,
        "AC_PLUGIN_DIR": str(tmp_path),
        "AC_CLOSE_CHECK_SINK": builtin,
        "AC_INTERCOM_TOKEN": "tok-0123456789",
        "AC_INTERCOM_ADMIN_ID": "1",
        "AC_WEBHOOK_URL": "http://127.0.0.1:9/hook",
        "AC_WEBHOOK_SECRET": "s3cret-0123",
    }
    sink = Pipeline(env, tmp_path, workers).start_sink("tests.support.sink_plugins:closing_check")
    await sink.wait_ready()
    sink.stop()  # SIGTERM: the runner's shutdown calls the sink's aclose()
    assert read_plugin_records(tmp_path, f"{builtin}-closed") == [{"closed": True}]
