"""``/metrics`` and ``/healthz`` of real workers on a real broker.

Scraped over HTTP and parsed with Prometheus' own text parser, as a Prometheus
server would read them.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.accumulate.compiled import compiled_for
from agents.accumulate.state import Limits
from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from sinks.base import Operation
from sinks.context import SessionContext
from streams.native import native
from streams.observe.lag import worker_status
from streams.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.pipeline import Pipeline, expected_summary_ranges, produce, settings_from
from tests.support.waiting import wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.kafka

PARTITIONS = 4  # unique_env's AC_PARTITIONS


class Scrape:
    """One scrape of ``/metrics``: every sample by name and labels."""

    def __init__(self, text: str) -> None:
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, dict(s.labels), s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]

    def value(self, name: str, **labels: str) -> float:
        """The sum over samples of ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for n, ls, v in self.samples if n == name and labels.items() <= ls.items())

    def one(self, name: str, **labels: str) -> float:
        """The single sample of ``name`` with these labels; it must exist."""
        found = [v for n, ls, v in self.samples if n == name and labels.items() <= ls.items()]
        assert len(found) == 1, (name, labels, found)
        return found[0]

    def series(self, name: str) -> dict[tuple[tuple[str, str], ...], float]:
        return {tuple(sorted(ls.items())): v for n, ls, v in self.samples if n == name}

    def lag(self) -> dict[tuple[str, int], float]:
        return {
            (ls["topic"], int(ls["partition"])): v
            for n, ls, v in self.samples
            if n == "ac_consumer_lag"
        }


async def scrape(worker: Worker) -> Scrape:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{worker.url}/metrics")
    response.raise_for_status()
    return Scrape(response.text)


async def health(worker: Worker) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{worker.url}/healthz")
    return response.status_code, response.json()


def all_partitions(settings: Settings, *names: str) -> set[tuple[str, int]]:
    return {(settings.topic(n), p) for n in names for p in range(PARTITIONS)}


async def wait_lag_zero(worker: Worker, expected: set[tuple[str, int]], timeout: float) -> None:
    """Every expected input partition reports lag, and all of it is 0."""
    last: dict[tuple[str, int], float] = {}

    async def settled() -> bool:
        nonlocal last
        last = (await scrape(worker)).lag()
        return set(last) == expected and not any(last.values())

    await wait_for(settled, timeout=timeout, interval=0.5, message=lambda: f"lag: {last}")


class GatedSink:
    """A destination that takes nothing until a file exists: a stalled sink."""

    name = "gated"

    def __init__(self, gate: Path) -> None:
        self.gate = gate

    @classmethod
    def from_settings(cls, settings: Settings) -> GatedSink:
        return cls(Path(os.environ["AC_GATE_FILE"]))

    async def apply(self, op: Operation, context: SessionContext) -> None:
        while not self.gate.exists():  # noqa: ASYNC110 (polls another process's file)
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------- tests


async def test_counters_move_and_lag_drains_after_a_run(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 5
    payloads = list(interleaved_payloads(plan_sessions(12, mean_length=14, seed=21), seed=21))
    sessions = {str(p["session_id"]) for p in payloads}
    total_actions = sum(len(p["actions"]) for p in payloads)
    summaries = sum(len(v) for v in expected_summary_ranges(payloads, threshold).values())

    async with FakeOpenAIServer() as llm:
        env = {
            **worker_env,
            "AC_THRESHOLD": str(threshold),
            "AC_LLM_API_KEY": "sk-test-not-a-secret",
            "AC_LLM_BASE_URL": llm.base_url,
            "AC_IDLE_TIMEOUT_S": "3600",
            "AC_LAG_INTERVAL_S": "0.5",
        }
        pipe = Pipeline(env, tmp_path, workers)
        pipeline, sink = pipe.start_pipeline(), pipe.start_sink("files")
        await asyncio.gather(pipeline.wait_ready(), sink.wait_ready())
        settings = settings_from(env)
        pipeline_inputs = all_partitions(settings, "actions", "summarize")
        # A sink also reads its own re-drive topic (its refused operations sent back).
        sink_inputs = all_partitions(settings, "context", "redrive.sink-files")

        # Before any input: the lag gauge is there for every assigned input partition.
        await wait_lag_zero(pipeline, pipeline_inputs, timeout=30)
        await wait_lag_zero(sink, sink_inputs, timeout=30)
        before = await scrape(pipeline)
        assert before.one("ac_actions_in_total") == 0
        assert before.value("ac_dead_letters_total") == 0

        produced_at = time.time()
        await produce(env, payloads)
        await produce_raw(settings, b"{malformed", key=b"bad-session")

        async def sink_done() -> bool:
            s = await scrape(sink)
            return (
                s.value("ac_sink_operations_total", sink="files", op="actions_written")
                == len(payloads)
                and s.value("ac_sink_operations_total", sink="files", op="summary_ready")
                == summaries
            )

        await wait_for(sink_done, timeout=180, interval=0.5, message="sink operations")

        p = await scrape(pipeline)
        assert p.one("ac_actions_in_total") == total_actions
        # Every payload took the compiled transition where it is built (scripts/bootstrap.sh).
        compiled = compiled_for(Limits(threshold=threshold, max_actions_per_batch=50))
        assert p.one("ac_compiled_payloads_total") == (len(payloads) if compiled else 0)
        # And every summarize request the compiled read (agents/summarize/compiled.py).
        assert p.one("ac_compiled_requests_total") == (summaries if native else 0)
        assert p.value("ac_summaries_total", outcome="rolling") == summaries
        assert p.one("ac_dead_letters_total", stage="accumulate", reason="not valid JSON") == 1
        assert p.one("ac_active_sessions") == len(sessions)
        assert p.value("ac_llm_latency_seconds_count") == summaries
        assert p.value("ac_llm_failures_total") == 0
        assert p.series("ac_llm_breaker_open") == {(): 0.0}

        s = await scrape(sink)
        ops = len(payloads) + summaries
        assert s.value("ac_sink_operations_total", sink="files", outcome="applied") == ops
        assert s.value("ac_end_to_end_seconds_count", sink="files") == ops
        # Event time (the user's timestamp_end): the synthetic stream is from 2023.
        newest_action = max(a["timestamp_end"] for p in payloads for a in p["actions"])
        assert s.value("ac_action_event_age_at_sink_seconds_count", sink="files") == len(payloads)
        age_sum = s.value("ac_action_event_age_at_sink_seconds_sum", sink="files")
        assert age_sum >= len(payloads) * (produced_at - newest_action)
        assert s.one("ac_action_event_age_at_sink_seconds_bucket", sink="files", le="86400.0") == 0
        # The age metric is from ingest (the record's Kafka timestamp): this run's seconds,
        # not the ~3 years the old code read from those timestamps.
        assert s.value("ac_action_age_at_sink_seconds_count", sink="files") == len(payloads)
        within = s.one("ac_action_age_at_sink_seconds_bucket", sink="files", le="300.0")
        assert within == len(payloads)

        await wait_lag_zero(pipeline, pipeline_inputs, timeout=60)
        await wait_lag_zero(sink, sink_inputs, timeout=60)

        async def each_record_acknowledged_once() -> bool:
            p, s = await scrape(pipeline), await scrape(sink)
            acked = "ac_records_acknowledged_total"
            return (
                p.value(acked, topic=settings.topic("actions")) == len(payloads) + 1  # + malformed
                and p.value(acked, topic=settings.topic("summarize")) == summaries
                and s.value(acked, topic=settings.topic("context")) == ops
            )

        await wait_for(each_record_acknowledged_once, timeout=30, message="records acknowledged")

        for worker, inputs in ((pipeline, pipeline_inputs), (sink, sink_inputs)):
            status, body = await health(worker)
            assert status == 200, body
            assert body["ready"] is True and body["recovered"] is True
            assert {tuple(x.rsplit(":", 1)) for x in body["assigned_partitions"]} == {
                (t, str(p)) for t, p in inputs
            }


async def test_lag_counts_what_a_stalled_sink_has_not_done(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 4
    payloads = list(interleaved_payloads(plan_sessions(6, mean_length=10, seed=4), seed=4))
    summaries = sum(len(v) for v in expected_summary_ranges(payloads, threshold).values())
    gate = tmp_path / "gate-open"
    env = {
        **worker_env,
        "AC_THRESHOLD": str(threshold),
        "AC_IDLE_TIMEOUT_S": "3600",
        "AC_LAG_INTERVAL_S": "0.5",
        "AC_GATE_FILE": str(gate),
    }
    pipe = Pipeline(env, tmp_path, workers)
    pipeline, sink = (
        pipe.start_pipeline(),
        pipe.start_sink("tests.integration.test_metrics:GatedSink"),
    )
    await asyncio.gather(pipeline.wait_ready(), sink.wait_ready())
    settings = settings_from(env)

    await produce(env, payloads)
    await wait_lag_zero(pipeline, all_partitions(settings, "actions", "summarize"), timeout=120)

    # Every operation the pipeline emitted is on `context`; none is done at the sink.
    backlog = len(payloads) + summaries
    last: float = -1

    async def stalled_at_backlog() -> bool:
        nonlocal last
        last = sum((await scrape(sink)).lag().values())
        return last == backlog

    await wait_for(
        stalled_at_backlog, timeout=60, interval=0.5, message=lambda: f"lag {last} != {backlog}"
    )
    status, body = await health(sink)
    assert status == 200 and body["ready"] is True  # stalled is not unhealthy: it's lag

    gate.touch()
    await wait_lag_zero(
        sink, all_partitions(settings, "context", "redrive.sink-gated"), timeout=120
    )
    s = await scrape(sink)
    assert s.value("ac_sink_operations_total", sink="gated", outcome="applied") == backlog


async def test_each_worker_reports_only_its_own_partitions_and_sessions(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """Two pipeline workers in one group split the partitions: their series don't overlap."""
    payloads = list(interleaved_payloads(plan_sessions(16, mean_length=6, seed=9), seed=9))
    sessions = {str(p["session_id"]) for p in payloads}
    env = {**worker_env, "AC_THRESHOLD": "100", "AC_IDLE_TIMEOUT_S": "3600"}
    env["AC_LAG_INTERVAL_S"] = "0.5"
    pipe = Pipeline(env, tmp_path, workers)
    first = await pipe.start_pipeline().wait_ready()
    settings = settings_from(env)
    inputs = all_partitions(settings, "actions", "summarize")
    await produce(env, payloads)
    await wait_lag_zero(first, inputs, timeout=120)
    assert (await scrape(first)).one("ac_active_sessions") == len(sessions)

    second = await pipe.start_pipeline().wait_ready()
    seen: dict[str, Any] = {}

    async def split() -> bool:
        a, b = await scrape(first), await scrape(second)
        lag_a, lag_b = a.lag(), b.lag()
        active = (a.one("ac_active_sessions"), b.one("ac_active_sessions"))
        seen.update(lag_a=sorted(lag_a), lag_b=sorted(lag_b), active=active)
        return (
            bool(lag_a)
            and bool(lag_b)
            and not set(lag_a) & set(lag_b)
            and set(lag_a) | set(lag_b) == inputs
            and not any(lag_a.values())
            and not any(lag_b.values())
            and sum(active) == len(sessions)
            and all(active)
        )

    await wait_for(split, timeout=120, interval=0.5, message=lambda: f"{seen}")
    for worker in (first, second):
        status, body = await health(worker)
        assert status == 200 and body["ready"] is True
        assert 0 < len(body["assigned_partitions"]) < len(inputs)


def fake_app(
    *,
    rebalancing: bool = False,
    recovered: bool = True,
    in_recovery: bool = False,
    started: bool = True,
    stopping: bool = False,
) -> Any:
    completed = asyncio.Event()
    if recovered:
        completed.set()
    return SimpleNamespace(
        conf=SimpleNamespace(id="app"),
        state="running",
        rebalancing=rebalancing,
        started=started,
        should_stop=stopping,
        consumer_generation_id=3,
        tables=SimpleNamespace(
            recovery=SimpleNamespace(completed=completed, in_recovery=in_recovery)
        ),
        consumer=SimpleNamespace(assignment=lambda: set()),
        agents={},
    )


@pytest.mark.parametrize(
    ("state", "ready"),
    [
        ({}, True),
        ({"rebalancing": True}, False),
        ({"recovered": False}, False),
        ({"in_recovery": True}, False),
        ({"started": False}, False),
        ({"stopping": True}, False),
    ],
)
def test_readiness_follows_the_app_state(state: dict[str, bool], ready: bool) -> None:
    status = worker_status(fake_app(**state))
    assert status["ready"] is ready
    assert status["assigned_partitions"] == []  # a spare worker with no partitions is ready


async def produce_raw(settings: Settings, value: bytes, *, key: bytes) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        await producer.send_and_wait(settings.topic("actions"), value, key=key)
    finally:
        await producer.stop()
