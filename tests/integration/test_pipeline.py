"""The core pipeline end to end on a real broker, with a real HTTP LLM on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import ActionsPayload
from sinks.files import context_file
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.cluster import metric, scrape
from tests.support.invariants import summary_text
from tests.support.pipeline import (
    Pipeline,
    batches_by_session,
    expected_summary_ranges,
    produce,
    pull_view,
)
from tests.support.pipeline import llm_env as pipeline_llm_env
from tests.support.waiting import wait_for
from tests.support.workers import FAST_REBALANCE, ROOT, Worker

pytestmark = pytest.mark.kafka

RECORDER = "tests.support.plugins:RecordingSink"


def llm_env(
    env: dict[str, str], llm: FakeOpenAIServer, threshold: int, **extra: str
) -> dict[str, str]:
    return {**env, **pipeline_llm_env(llm, threshold, **extra)}


def totals(payloads: list[dict[str, Any]]) -> dict[str, int]:
    return {
        sid: sum(len(p["actions"]) for p in ps) for sid, ps in batches_by_session(payloads).items()
    }


async def wait_until_summarised(
    pipe: Pipeline, payloads: list[dict[str, Any]], threshold: int, timeout: float
) -> None:
    """Every action written and every expected summary applied at the recorder."""
    expected = expected_summary_ranges(payloads, threshold)
    want = totals(payloads)

    def progress() -> tuple[int, int]:
        by = pipe.records_by_session()
        done = sum(
            1
            for sid in want
            if max((r["seq_to"] for r in by[sid] if r["op"] == "actions_written"), default=0)
            == want[sid]
            and len([r for r in by[sid] if r["op"] == "summary_ready"]) >= len(expected[sid])
        )
        return done, len(want)

    def finished() -> bool:
        done, total = progress()
        return done == total

    await wait_for(
        finished,
        timeout=timeout,
        interval=0.5,
        message=lambda: f"sessions complete at the recorder: {progress()}",
    )


def check_operation_log(pipe: Pipeline, payloads: list[dict[str, Any]], threshold: int) -> None:
    expected = expected_summary_ranges(payloads, threshold)
    for sid, records in pipe.records_by_session().items():
        writes = [r for r in records if r["op"] == "actions_written"]
        # Raw batches: contiguous from 1, in order, each exactly once.
        assert [r["seq_from"] for r in writes] == [1] + [r["seq_to"] + 1 for r in writes[:-1]], sid
        summaries = [r for r in records if r["op"] == "summary_ready"]
        assert [s["seq_to"] for s in summaries] == expected[sid], sid
        # Rolling: each covers the session from 1; the windows are contiguous, never overlapping.
        assert all(s["seq_from"] == 1 for s in summaries), sid
        assert [s["window_from"] for s in summaries] == [1] + [
            s["seq_to"] + 1 for s in summaries[:-1]
        ]
        # Each summary is applied after every batch it covers.
        for position, record in enumerate(records):
            if record["op"] == "summary_ready":
                applied_before = {
                    r["seq_to"] for r in records[:position] if r["op"] == "actions_written"
                }
                covered = {r["seq_to"] for r in writes if r["seq_to"] <= record["seq_to"]}
                assert covered <= applied_before, (sid, record["seq_to"])


def expected_context(payloads: list[dict[str, Any]], last_summary: dict[str, Any] | None) -> str:
    """What the files sink must hold: the last summary with its ledger, then exactly the
    batches after its range, numbered with the session's sequence numbers."""
    parts, seq = [], 0
    if last_summary is not None:
        parts.append(summary_text(last_summary))
    covered_to = last_summary["seq_to"] if last_summary else 0
    for p in payloads:
        if seq + len(p["actions"]) > covered_to:
            parts.append(ActionsPayload.model_validate(p).numbered_text(seq + 1))
        seq += len(p["actions"])
    return "\n\n".join(parts) + "\n"


# The compiled transition where built, and the Python one (AC_COMPILED=false): the same
# operations, summaries and context files (tests/unit/test_compiled.py: the same bytes).
@pytest.mark.parametrize("compiled", ["true", "false"])
async def test_rolling_summaries_end_to_end(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker], compiled: str
) -> None:
    threshold = 10
    payloads = list(interleaved_payloads(plan_sessions(200, mean_length=60, seed=11), seed=11))
    async with FakeOpenAIServer() as llm:
        env = llm_env(worker_env, llm, threshold, AC_COMPILED=compiled)
        pipe = Pipeline(env, tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        await produce(pipe.env, payloads)
        await wait_until_summarised(pipe, payloads, threshold, timeout=300)

        check_operation_log(pipe, payloads, threshold)

        by_session = pipe.records_by_session()
        prompts: dict[str, list[str]] = {}
        for request in llm.completed():
            prompts.setdefault(str(request.session), []).append(request.prompt)
        for sid, records in by_session.items():
            summaries = [r["summary"] for r in records if r["op"] == "summary_ready"]
            assert len(prompts.get(sid, [])) == len(summaries), sid
            for previous, prompt in zip(summaries, prompts.get(sid, [])[1:], strict=False):
                assert previous in prompt, f"{sid}: a prompt lacks the previous summary"

        await wait_for_context_files(pipe, payloads)


async def wait_for_context_files(pipe: Pipeline, payloads: list[dict[str, Any]]) -> None:
    """The files sink holds, per session, the last summary and exactly the batches after it."""
    files_dir = Path(pipe.env["AC_FILES_DIR"])
    by_session = pipe.records_by_session()

    def wrong_files() -> list[str]:
        wrong = []
        for sid, batches in batches_by_session(payloads).items():
            summaries = [r for r in by_session[sid] if r["op"] == "summary_ready"]
            want = expected_context(batches, summaries[-1] if summaries else None)
            path = context_file(files_dir, sid)
            if not path.exists() or path.read_text(encoding="utf-8") != want:
                wrong.append(sid)
        return wrong

    await wait_for(
        lambda: not wrong_files(),
        timeout=120,
        interval=0.5,
        message=lambda: f"context files differ for {wrong_files()[:5]}",
    )


async def test_rocksdb_state_survives_kill9_and_restart(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """With ``AC_STORE=rocksdb://``: the pipeline is SIGKILLed and the sinks stopped
    mid-stream, all restart on their RocksDB state, and the result is exactly what
    an uninterrupted run gives (each batch once, contiguous ranges, summaries as due)."""
    threshold = 8
    payloads = list(interleaved_payloads(plan_sessions(40, mean_length=30, seed=5), seed=5))
    half = len(payloads) // 2
    async with FakeOpenAIServer() as llm:
        env = llm_env(worker_env, llm, threshold, AC_STORE="rocksdb://", **FAST_REBALANCE)
        pipe = Pipeline(env, tmp_path, workers)

        def start_all() -> list[Worker]:
            return [pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink(RECORDER)]

        first = start_all()
        await asyncio.gather(*(w.wait_ready() for w in first))
        await produce(pipe.env, payloads[:half])
        await wait_for(
            lambda: len(pipe.records()) >= half // 2,
            timeout=60,
            interval=0.2,
            message=lambda: f"{len(pipe.records())} operations recorded",
        )
        first[0].kill()  # the pipeline: no final commit, state only in RocksDB + changelog
        for sink in first[1:]:
            sink.stop()
        second = start_all()
        await asyncio.gather(*(w.wait_ready() for w in second))
        await produce(pipe.env, payloads[half:])
        await wait_until_summarised(pipe, payloads, threshold, timeout=150)

        check_operation_log(pipe, payloads, threshold)
        await wait_for_context_files(pipe, payloads)


async def test_a_killed_workers_replacement_applies_actions_within_seconds(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """The default session timeout (no FAST_REBALANCE here): the pipeline worker is
    killed (-9) and its replacement started at once. Faust's default (60 s) left every
    partition idle for a minute; now the time from the kill to the first applied
    operation on every partition is the session timeout (10 s) plus a rebalance."""
    pipe = Pipeline({**worker_env, "AC_IDLE_TIMEOUT_S": "3600"}, tmp_path, workers)
    first, sink = pipe.start_pipeline(), pipe.start_sink("files")
    await asyncio.gather(first.wait_ready(), sink.wait_ready())
    sessions = [f"kill-{i}" for i in range(12)]  # every one of the 4 partitions gets some

    def one_action(sid: str, n: int) -> dict[str, Any]:
        return {"session_id": sid, "actions": [{"type": "click", "description": f"a{n}"}]}

    async def applied_everywhere(n: int) -> bool:
        views = [await pull_view(sink, sid) for sid in sessions]
        return all(v is not None and v["actions_applied"] >= n for v in views)

    await produce(pipe.env, [one_action(sid, 1) for sid in sessions])
    await wait_for(lambda: applied_everywhere(1), timeout=60, message="before the kill")
    first.kill()
    killed = time.monotonic()
    pipe.start_pipeline()
    await produce(pipe.env, [one_action(sid, 2) for sid in sessions])
    await wait_for(lambda: applied_everywhere(2), timeout=90, message="after the kill")
    recovered_in = time.monotonic() - killed
    print(f"kill -9 to the first operation applied on every partition: {recovered_in:.1f}s")
    assert recovered_in < 30, recovered_in


async def test_a_full_batch_buffer_pauses_fetching_and_loses_nothing(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """``AC_BATCH_BUFFER=4``: every worker's BatchSource fills at once, pauses its
    partitions and resumes them many times; the result is still exactly right."""
    threshold = 6
    payloads = list(interleaved_payloads(plan_sessions(30, mean_length=20, seed=8), seed=8))
    async with FakeOpenAIServer() as llm:
        env = llm_env(worker_env, llm, threshold, AC_BATCH_BUFFER="4")
        pipe = Pipeline(env, tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        await produce(pipe.env, payloads)  # all at once: a backlog for every worker
        await wait_until_summarised(pipe, payloads, threshold, timeout=240)

        check_operation_log(pipe, payloads, threshold)
        await wait_for_context_files(pipe, payloads)
        pauses = metric(await scrape(started[0].url), "ac_fetch_pauses_total")
        assert pauses > 0, "the pipeline never paused: the buffer bound was not exercised"


async def test_llm_calls_overlap_across_sessions_never_within_one(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 5
    payloads = list(interleaved_payloads(plan_sessions(24, mean_length=25, seed=3), seed=3))
    async with FakeOpenAIServer(latency_s=0.3) as llm:
        pipe = Pipeline(llm_env(worker_env, llm, threshold), tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        await produce(pipe.env, payloads)
        await wait_until_summarised(pipe, payloads, threshold, timeout=180)
        check_operation_log(pipe, payloads, threshold)
        assert llm.max_in_flight > 1
        assert max(llm.max_in_flight_by_session.values()) == 1


async def test_llm_outage_loses_nothing_and_the_breaker_recovers(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 5
    payloads = list(interleaved_payloads(plan_sessions(30, mean_length=20, seed=5), seed=5))
    async with FakeOpenAIServer(retry_after_s=0.5, timeout_hold_s=5) as llm:
        env = llm_env(
            worker_env,
            llm,
            threshold,
            AC_LLM_TIMEOUT_S="1",
            AC_BREAKER_FAILURES="3",
            AC_BREAKER_RESET_S="1",
            AC_LLM_RETRY_MAX_WAIT_S="1",
            AC_LLM_RETRY_BUDGET_S="120",
        )
        pipe = Pipeline(env, tmp_path, workers)
        pipeline = pipe.start_pipeline()
        started = [pipeline, pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        llm.fail("429", "timeout", "500")
        llm.fail_for("500", 6)
        await produce(pipe.env, payloads)
        await wait_until_summarised(pipe, payloads, threshold, timeout=180)
        check_operation_log(pipe, payloads, threshold)
        failed_modes = {r.mode for r in llm.requests if r.mode != "ok"}
        assert {"429", "timeout", "500"} <= failed_modes
        log = pipeline.log_text()
        assert "LLM circuit breaker opened" in log
        assert "LLM circuit breaker closed" in log
        assert log.index("LLM circuit breaker opened") < log.rindex("LLM circuit breaker closed")


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"AC_PROMPT": "Summarise the session please."}, "must contain {actions}"),
        ({"AC_PROMPT": "Actions: {actions} {0}"}, "does not format"),
        ({"AC_THRESHOLD": "0"}, "AC_THRESHOLD must be >= 1"),
        # The old code: a 59-line traceback ending in FileNotFoundError.
        (
            {"AC_PROMPT_FILE": "/no/such/prompt.txt"},
            "invalid setting AC_PROMPT_FILE: cannot read '/no/such/prompt.txt': "
            "No such file or directory",
        ),
        (  # The old code: a 40-line traceback ending in "Unable to bootstrap from".
            {"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "AC_BROKER_WAIT_S": "1"},
            "cannot reach the Kafka broker at 127.0.0.1:9 (Connection refused) within 1s: "
            "is it running, and is KAFKA_BOOTSTRAP_SERVERS its address?",
        ),
        (
            {"AC_LLM_BASE_URL": "llm.example.com/v1"},
            "invalid setting AC_LLM_BASE_URL: 'llm.example.com/v1' is not an http:// or "
            "https:// URL with a host",
        ),
    ],
)
def test_bad_configuration_stops_the_worker_at_start(
    env: dict[str, str], message: str, tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "faust", "-A", "agents.app", "worker"],
        cwd=ROOT,
        env={**os.environ, "AC_DATA_DIR": str(tmp_path), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert message in done.stderr + done.stdout
    assert "Traceback" not in done.stderr + done.stdout  # one line, not a stack
