from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import kafka_broker
from tests.support.kafka_io import delete_topics_at_the_end
from tests.support.workers import Worker, unique_env


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_broker() as address:
        yield address


@pytest.fixture
async def worker_env(kafka_bootstrap: str, tmp_path: Path) -> AsyncIterator[dict[str, str]]:
    """A test's own topics and groups; its topics are deleted at the end."""
    env = unique_env(kafka_bootstrap, tmp_path)
    yield env
    await delete_topics_at_the_end(env)


@pytest.fixture
async def workers(worker_env: dict[str, str], tmp_path: Path) -> AsyncIterator[list[Worker]]:
    """Workers started by a test; all stopped (and their logs kept) at the end, and
    their topics deleted: a development broker kept ~160 topics per run otherwise.
    (It asks for ``worker_env`` so that it is torn down after: workers stop, then
    ``worker_env``'s topics go; this deletes only those of other envs.)"""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()
    keys = ("KAFKA_BOOTSTRAP_SERVERS", "AC_TOPIC_PREFIX", "AC_APP_ID")
    envs = {
        tuple(w.env[k] for k in keys): w.env
        for w in started
        if all(k in w.env for k in keys)
        and w.env["AC_TOPIC_PREFIX"] != worker_env["AC_TOPIC_PREFIX"]
    }
    for env in envs.values():
        await delete_topics_at_the_end(env)


WORKER_LOG_TAIL_LINES = 60


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[Any]:
    """A failed test's report ends with the tail of each worker log under its
    ``tmp_path``: CI keeps only the output, and a stall is diagnosed from the logs."""
    outcome = yield
    report = outcome.get_result()
    tmp_path = getattr(item, "funcargs", {}).get("tmp_path")
    if report.when != "call" or not report.failed or not isinstance(tmp_path, Path):
        return
    for log in sorted(tmp_path.rglob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-WORKER_LOG_TAIL_LINES:]
        report.sections.append((f"worker log {log.name} (last lines)", "\n".join(lines)))
