"""A running pipeline for integration tests: workers, a producer, and expectations."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
from aiokafka import AIOKafkaProducer

from streams.settings import Settings
from streams.topics import ensure_topics
from tests.support.plugins import read_records
from tests.support.workers import Worker


def llm_env(llm: Any, threshold: int, **extra: str) -> dict[str, str]:
    """A pipeline's settings for the loopback OpenAI server ``llm`` (a ``FakeOpenAIServer``):
    summaries every ``threshold`` actions, each prompt's lines named by session."""
    return {
        "AC_THRESHOLD": str(threshold),
        "AC_LLM_API_KEY": "sk-test-not-a-secret",
        "AC_LLM_BASE_URL": llm.base_url,
        "AC_FORMAT_ACTIONS": "tests.support.plugins:format_with_session",
        "AC_IDLE_TIMEOUT_S": "3600",
        **extra,
    }


def settings_from(env: dict[str, str]) -> Settings:
    return Settings(
        kafka_bootstrap_servers=env["KAFKA_BOOTSTRAP_SERVERS"],
        topic_prefix=env["AC_TOPIC_PREFIX"],
        partitions=int(env["AC_PARTITIONS"]),
        app_id=env["AC_APP_ID"],
    )


async def produce(env: dict[str, str], payloads: list[dict[str, Any]]) -> None:
    """Produce like a connector would: JSON keyed by session_id, acknowledged by the broker."""
    settings = settings_from(env)
    await ensure_topics(settings)
    producer = AIOKafkaProducer(
        bootstrap_servers=settings.kafka_bootstrap_servers, acks="all", linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                settings.topic("actions"), orjson.dumps(p), key=str(p["session_id"]).encode()
            )
            for p in payloads
        ]
        for fut in futures:
            await fut
    finally:
        await producer.stop()


async def pull_view(sink: Worker, session_id: str) -> dict[str, Any] | None:
    """A sink worker's pull view of a session (``GET /sessions/{id}/context``), or None."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{sink.url}/sessions/{session_id}/context")
    return response.json() if response.status_code == 200 else None


def expected_summary_ranges(payloads: list[dict[str, Any]], threshold: int) -> dict[str, list[int]]:
    """Per session, the seq_to of every threshold crossing (batches are never split)."""
    pending: dict[str, int] = defaultdict(int)
    seq: dict[str, int] = defaultdict(int)
    crossings: dict[str, list[int]] = defaultdict(list)
    for p in payloads:
        sid, n = str(p["session_id"]), len(p["actions"])
        seq[sid] += n
        pending[sid] += n
        if pending[sid] >= threshold:
            crossings[sid].append(seq[sid])
            pending[sid] = 0
    return crossings


def batches_by_session(payloads: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in payloads:
        out[str(p["session_id"])].append(p)
    return out


@dataclass
class Pipeline:
    env: dict[str, str]
    workdir: Path
    workers: list[Worker]
    record_file: Path = field(init=False)

    def __post_init__(self) -> None:
        self.record_file = self.workdir / "records.jsonl"

    def start_pipeline(self, **env: str) -> Worker:
        worker = Worker(
            "agents.app", {**self.env, **env}, self.workdir / f"pipeline-{len(self.workers)}.log"
        ).start()
        self.workers.append(worker)
        return worker

    def start_sink(self, sink: str, **env: str) -> Worker:
        worker = Worker(
            "sinks.app",
            {**self.env, "AC_SINK": sink, "AC_RECORD_FILE": str(self.record_file), **env},
            self.workdir / f"sink-{sink.rsplit(':', 1)[-1]}-{len(self.workers)}.log",
        ).start()
        self.workers.append(worker)
        return worker

    def records(self) -> list[dict[str, Any]]:
        return read_records(self.record_file)

    def records_by_session(self) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for record in self.records():
            out[str(record["session_id"])].append(record)
        return out
