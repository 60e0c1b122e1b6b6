from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

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
