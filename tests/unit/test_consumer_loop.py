"""Where Faust's Kafka consumer runs (streams/_faust/consumer.py).

Every integration test consumes through the default; these pin the wiring."""

from __future__ import annotations

import asyncio
from pathlib import Path

from streams.app import create_app
from streams.settings import Settings


async def test_the_kafka_consumer_runs_on_the_workers_event_loop(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    consumer_service = app.consumer._thread  # Faust's name: a thread, by default
    assert consumer_service.thread_loop is asyncio.get_running_loop()


async def test_consumer_thread_setting_keeps_fausts_own_thread(tmp_path: Path) -> None:
    app = create_app(Settings(data_dir=tmp_path, consumer_thread=True), role="pipeline")
    consumer_service = app.consumer._thread
    try:
        assert consumer_service.thread_loop is not asyncio.get_running_loop()
    finally:
        consumer_service.thread_loop.close()  # made for the thread, which never started
