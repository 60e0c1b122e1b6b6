"""The ``agent-context`` command line against a real broker and real workers.

Each command runs as a user would run it (``python -m agents.cli ...`` in a
subprocess, settings from the environment); what it did is checked by reading
the topics back and asking a sink worker.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import DeadLetter, encode
from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.cli import cli, cli_command
from tests.support.kafka_io import delete_topics_at_the_end
from tests.support.pipeline import expected_summary_ranges, pull_view, settings_from
from tests.support.waiting import wait_for
from tests.support.workers import ROOT, Worker, unique_env

pytestmark = pytest.mark.kafka

THRESHOLD = 4


@dataclass
class Deployment:
    env: dict[str, str]
    settings: Settings
    pipeline: Worker
    sink: Worker
    workdir: Path


@pytest.fixture(scope="module")
async def deployment(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Deployment]:
    """One pipeline worker and one files sink worker, shared by this module's tests."""
    workdir = tmp_path_factory.mktemp("cli")
    env = unique_env(
        kafka_bootstrap, workdir, AC_THRESHOLD=str(THRESHOLD), AC_IDLE_TIMEOUT_S="3600"
    )
    pipeline = Worker("agents.app", env, workdir / "pipeline.log").start()
    sink = Worker("sinks.app", {**env, "AC_SINK": "files"}, workdir / "sink.log").start()
    try:
        await asyncio.gather(pipeline.wait_ready(), sink.wait_ready())
        yield Deployment(env, settings_from(env), pipeline, sink, workdir)
    finally:
        pipeline.stop()
        sink.stop()
        await delete_topics_at_the_end(env)


# --------------------------------------------------------------------------- helpers


async def read_topic(settings: Settings, name: str) -> list[Any]:
    """Every record of a topic, from its beginning to its end offsets now."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers, enable_auto_commit=False
    )
    await consumer.start()
    try:
        topic = settings.topic(name)
        tps = [TopicPartition(topic, p) for p in range(settings.partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        records: list[Any] = []

        async def drained() -> bool:
            batch = await consumer.getmany(timeout_ms=200)
            for part in batch.values():
                records.extend(part)
            return all([await consumer.position(tp) >= ends[tp] for tp in tps])

        await wait_for(drained, timeout=30, interval=0, message=f"reading {topic}")
        return records
    finally:
        await consumer.stop()


async def write_dead_letters(settings: Settings, letters: list[DeadLetter]) -> None:
    """Write dead letters straight to the topic, as a stage would have."""
    await ensure_topics(settings)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for letter in letters:
            await producer.send_and_wait(
                settings.topic("dead-letters"), encode(letter), key=(letter.key or "").encode()
            )
    finally:
        await producer.stop()


async def wait_applied(sink: Worker, want: dict[str, int], timeout: float = 120) -> None:
    """The sink's pull view has applied ``want[session]`` actions for every session."""
    missing: list[str] = []

    async def applied() -> bool:
        missing[:] = []
        for sid, count in want.items():
            view = await pull_view(sink, sid)
            if view is None or view["actions_applied"] != count:
                missing.append(sid)
        return not missing

    await wait_for(applied, timeout=timeout, interval=0.3, message=lambda: f"waiting: {missing}")


def payload(session_id: str, *descriptions: str) -> dict[str, Any]:
    now = time.time()
    return {
        "type": "actions",
        "product_id": "prod-cli",
        "session_id": session_id,
        "user_id": "u1",
        "forwarded_at": now,
        "actions": [
            {
                "index": i,
                "type": "click",
                "title": text,
                "description": text,
                "canonical_url": "https://app.example.com/reports",
                "timestamp_start": now - 1,
                "timestamp_end": now,
            }
            for i, text in enumerate(descriptions)
        ],
    }


def tag() -> str:
    return uuid.uuid4().hex[:6]


# --------------------------------------------------------------------------- tests


async def test_produce_sample_lands_every_session_in_order(deployment: Deployment) -> None:
    prefix = f"cs{tag()}"
    done = await cli(
        deployment.env,
        *("produce-sample", "--sessions", "6", "--mean-length", "8", "--seed", "5"),
        *("--session-prefix", prefix),
    )
    assert done.returncode == 0, done.stderr
    assert "for 6 sessions" in done.stdout

    plans = plan_sessions(6, mean_length=8, seed=5, prefix=prefix)
    expected: dict[str, list[bytes]] = defaultdict(list)
    for p in interleaved_payloads(plans, seed=5, product_id="prod_demo"):
        expected[str(p["session_id"])].append(orjson.dumps(p))
    landed: dict[str, list[bytes]] = defaultdict(list)
    for record in await read_topic(deployment.settings, "actions"):
        key = record.key.decode()
        if key.startswith(prefix):
            landed[key].append(record.value)
    assert landed == expected  # every payload once, keyed by its session, in session order

    await wait_applied(deployment.sink, {plan.session_id: plan.length for plan in plans})

    # `context` shows what the agent reads: the summary, then the batches after it.
    plan = max(plans, key=lambda p: p.length)
    shown = await cli(deployment.env, "context", plan.session_id, "--url", deployment.sink.url)
    assert shown.returncode == 0, shown.stderr
    view = await pull_view(deployment.sink, plan.session_id)
    assert view is not None
    assert shown.stdout.startswith(f"Session {plan.session_id}: {plan.length} actions applied")
    assert view["text"].rstrip("\n") in shown.stdout
    assert "Summary of actions 1-" in shown.stdout  # length >= THRESHOLD


async def test_context_reports_what_is_wrong(deployment: Deployment) -> None:
    unknown = await cli(deployment.env, "context", "no-such-session", "--url", deployment.sink.url)
    assert unknown.returncode == 1
    assert "no context for session 'no-such-session'" in unknown.stderr

    unreachable = await cli(deployment.env, "context", "s", "--url", "http://127.0.0.1:9")
    assert unreachable.returncode == 1
    assert "cannot reach http://127.0.0.1:9 (ConnectError); is `faust -A sinks.app worker`" in (
        unreachable.stderr
    )


async def test_tail_prints_operations(deployment: Deployment) -> None:
    prefix = f"tl{tag()}"
    done = await cli(
        deployment.env,
        *("produce-sample", "--sessions", "1", "--mean-length", "9", "--seed", "2"),
        *("--session-prefix", prefix),
    )
    assert done.returncode == 0, done.stderr
    (plan,) = plan_sessions(1, mean_length=9, seed=2, prefix=prefix)
    batches = [p for p in interleaved_payloads([plan], seed=2) if p["session_id"]]
    summaries = len(expected_summary_ranges(batches, THRESHOLD)[plan.session_id])
    await wait_applied(deployment.sink, {plan.session_id: plan.length})

    ops = len(batches) + summaries
    history = await cli(
        deployment.env,
        *("tail", "--from-beginning", "--session", plan.session_id, "--count", str(ops)),
    )
    assert history.returncode == 0, history.stderr
    heads = [line for line in history.stdout.splitlines() if not line.startswith("    ")]
    assert len(heads) == ops
    assert all(plan.session_id in line for line in heads)
    assert sum("actions_written" in line for line in heads) == len(batches)
    assert sum("summary_ready" in line for line in heads) == summaries
    assert f"actions_written  #1-{len(batches[0]['actions'])} " in heads[0]
    first = batches[0]["actions"][0]
    assert f"    [0] {first['type']}: {first['description']}" in history.stdout

    # Live: an operation emitted after `tail` started is printed as it happens.
    live_session = f"live{tag()}"
    proc = await asyncio.create_subprocess_exec(
        *cli_command("tail", "--session", live_session, "--count", "1"),
        cwd=ROOT,
        env={**os.environ, **deployment.env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        assert proc.stderr is not None and proc.stdout is not None
        started = await asyncio.wait_for(proc.stderr.readline(), 60)
        assert b"tailing" in started
        source = deployment.workdir / f"{live_session}.jsonl"
        source.write_bytes(orjson.dumps(payload(live_session, "Opened live report")) + b"\n")
        produced = await cli(deployment.env, "produce-file", str(source))
        assert produced.returncode == 0, produced.stderr
        out = await asyncio.wait_for(proc.stdout.read(), 60)
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    text = out.decode()
    assert f"{live_session}  actions_written  #1-1 (1 actions)" in text
    assert "click: Opened live report — https://app.example.com/reports" in text


async def test_produce_file_dead_letters_invalid_lines(deployment: Deployment) -> None:
    t = tag()
    good_1 = orjson.dumps(payload(f"pf1{t}", "Clicked Export CSV"))
    good_2 = orjson.dumps(payload(f"pf2{t}", "Opened billing", "Clicked Upgrade"))
    no_session = orjson.dumps({**payload("x", "Clicked"), "session_id": ""})
    lines = [good_1, b"{not json", b"", no_session, good_2]
    source = deployment.workdir / f"input-{t}.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")

    done = await cli(deployment.env, "produce-file", str(source))
    assert done.returncode == 3, done.stdout + done.stderr
    assert f"{source}:line 2: not valid JSON" in done.stderr
    assert f"{source}:line 4: invalid ActionsPayload" in done.stderr
    assert "session_id is missing or empty" in done.stderr
    assert "produced 2 payloads (3 actions)" in done.stdout
    assert "2 invalid records dead-lettered" in done.stdout and "line 2, line 4" in done.stdout

    letters = [
        decode_letter(r.value)
        for r in await read_topic(deployment.settings, "dead-letters")
        if decode_letter(r.value).source_topic == f"file:{source}"
    ]
    assert sorted((x.offset, x.original) for x in letters) == [(2, lines[1]), (4, lines[3])]
    assert {x.stage for x in letters} == {"produce-file"}
    actions = {
        r.key.decode(): r.value
        for r in await read_topic(deployment.settings, "actions")
        if r.key.decode().endswith(t)
    }
    assert actions == {f"pf1{t}": good_1, f"pf2{t}": good_2}  # the exact bytes of the file
    await wait_applied(deployment.sink, {f"pf1{t}": 1, f"pf2{t}": 2})

    # A JSON array works too; its items are numbered.
    array = deployment.workdir / f"input-{t}.json"
    array.write_bytes(orjson.dumps([payload(f"pa{t}", "One"), {"actions": []}]))
    done = await cli(deployment.env, "produce-file", str(array))
    assert done.returncode == 3
    assert f"{array}:item 2: missing event type" in done.stderr  # parse_frame's rule
    assert "produced 1 payloads (1 actions)" in done.stdout

    # All valid, from stdin: exit 0.
    done = await cli(deployment.env, "produce-file", "-", stdin=good_1 + b"\n")
    assert done.returncode == 0, done.stderr
    assert "produced 1 payloads" in done.stdout and "invalid" not in done.stdout

    missing = await cli(deployment.env, "produce-file", str(deployment.workdir / "nope.jsonl"))
    assert missing.returncode == 1
    assert "cannot read" in missing.stderr and "No such file" in missing.stderr


def decode_letter(raw: bytes) -> DeadLetter:
    return DeadLetter.model_validate_json(raw)


async def test_redrive_moves_a_fixed_dead_letter_back_once(deployment: Deployment) -> None:
    settings = deployment.settings
    t = tag()
    fixed_session, broken_session = f"rd{t}", f"rdbad{t}"
    fixed = orjson.dumps(payload(fixed_session, "Clicked Retry import"))

    def letter(stage: str, original: bytes, offset: int, key: str) -> DeadLetter:
        return DeadLetter(
            reason="invalid ActionsPayload: (a bug, fixed since)",
            stage=stage,
            source_topic=settings.topic("actions"),
            partition=1,
            offset=offset,
            key=key,
            original_b64=DeadLetter.encode_original(original),
            failed_at=time.time(),
        )

    await write_dead_letters(
        settings,
        [
            letter("accumulate", fixed, 1000, fixed_session),  # now parses
            letter("accumulate", fixed, 1000, fixed_session),  # the same letter again (replay)
            letter("accumulate", b'{"session_id": ', 1001, broken_session),  # still broken
            letter("summarize", fixed, 1002, fixed_session),  # not an actions payload stage
        ],
    )

    def ours(records: list[Any]) -> int:
        return sum(1 for r in records if r.key == fixed_session.encode() and r.value == fixed)

    listed = await cli(deployment.env, "dead-letters", "list", "--limit", "50")
    assert listed.returncode == 0, listed.stderr
    assert f"key={fixed_session}" in listed.stdout and "(a bug, fixed since)" in listed.stdout
    assert 'original (15 bytes): {"session_id": ' in listed.stdout

    dry = await cli(deployment.env, "dead-letters", "redrive", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert f"would re-drive into {settings.topic('actions')}: 1" in dry.stdout
    assert "dry run: nothing produced, no offsets committed" in dry.stdout

    assert ours(await read_topic(settings, "actions")) == 0

    done = await cli(deployment.env, "dead-letters", "redrive")
    assert done.returncode == 0, done.stderr
    report = done.stdout
    assert f"re-driven into {settings.topic('actions')}: 1" in report
    assert "still invalid: 1" in report
    assert "duplicates skipped: 1" in report
    assert "summarize: 1" in report
    assert f"key={broken_session}" in report  # the one that still fails is shown

    assert ours(await read_topic(settings, "actions")) == 1
    await wait_applied(deployment.sink, {fixed_session: 1})
    shown = await cli(deployment.env, "context", fixed_session, "--url", deployment.sink.url)
    assert "click: Clicked Retry import" in shown.stdout

    again = await cli(deployment.env, "dead-letters", "redrive")
    assert again.returncode == 0, again.stderr
    assert "examined 0 dead letters" in again.stdout
    assert ours(await read_topic(settings, "actions")) == 1


async def test_user_errors_are_one_clear_line(deployment: Deployment, tmp_path: Path) -> None:
    down = await cli(
        deployment.env, "produce-sample", "--sessions", "1", "--bootstrap", "127.0.0.1:9"
    )
    assert down.returncode == 1
    assert down.stderr.strip() == "error: cannot connect to Kafka at 127.0.0.1:9"

    wrong_stage = await cli(deployment.env, "dead-letters", "redrive", "--stage", "summarize")
    assert wrong_stage.returncode == 2
    assert "cannot re-drive stage summarize" in wrong_stage.stderr

    bad_settings = await cli({**deployment.env, "AC_PARTITIONS": "0"}, "dead-letters", "list")
    assert bad_settings.returncode == 1
    assert "invalid setting AC_PARTITIONS:" in bad_settings.stderr

    other = unique_env(deployment.settings.kafka_bootstrap_servers, tmp_path)
    no_topic = await cli(other, "tail", "--count", "1")
    assert no_topic.returncode == 1
    assert "does not exist" in no_topic.stderr

    usage = await cli(deployment.env, "produce-sample", "--sessions", "0")
    assert usage.returncode == 2


def test_console_script_is_installed() -> None:
    script = shutil.which("agent-context", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the project is not installed in this interpreter's environment")
    done = subprocess.run([script, "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0
    for command in ("produce-sample", "produce-file", "context", "tail", "dead-letters"):
        assert command in done.stdout
