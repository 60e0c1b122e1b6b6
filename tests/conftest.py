from __future__ import annotations

from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.broker import kafka_broker
from tests.support.workers import Worker, unique_env


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    with kafka_broker() as address:
        yield address


@pytest.fixture
def worker_env(kafka_bootstrap: str, tmp_path: Path) -> dict[str, str]:
    return unique_env(kafka_bootstrap, tmp_path)


@pytest.fixture
async def workers(tmp_path: Path) -> AsyncIterator[list[Worker]]:
    """Workers started by a test; all stopped (and their logs kept) at the end."""
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.stop()


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
