"""Sinks that test workers load from settings only (``AC_SINK=tests.support.sink_plugins:...``).

They write what they receive to JSON-lines files under ``AC_PLUGIN_DIR``, one
file per sink, so a test can check order and completeness from outside.
"""

from __future__ import annotations

import asyncio
import atexit
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson

from sinks.base import Operation
from sinks.context import SessionContext
from streams.settings import Settings
from tests.support.plugins import read_records

__all__ = [
    "SlowSink",
    "append_record",
    "closing_check",
    "make_counting_sink",
    "plugin_file",
    "sync_pair",
]


def plugin_file(name: str) -> Path:
    directory = Path(os.environ.get("AC_PLUGIN_DIR", ".agent-context/plugins"))
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{name}.jsonl"


def append_record(name: str, record: dict[str, Any]) -> None:
    with plugin_file(name).open("ab") as handle:
        handle.write(orjson.dumps(record) + b"\n")


def read_plugin_records(directory: Path, name: str) -> list[dict[str, Any]]:
    return read_records(directory / f"{name}.jsonl")


class SlowSink:
    """A destination that takes ``AC_SLOW_SINK_DELAY_S`` (default 0.2 s) per operation."""

    name = "slow"

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s

    @classmethod
    def from_settings(cls, settings: Settings) -> SlowSink:
        return cls(float(os.environ.get("AC_SLOW_SINK_DELAY_S", "0.2")))

    async def apply(self, op: Operation, context: SessionContext) -> None:
        await asyncio.sleep(self.delay_s)
        append_record(self.name, op.model_dump(mode="json", exclude={"payload"}))


class _Counting:
    def __init__(self, label: str) -> None:
        self.name = label
        self.applied = 0

    async def apply(self, op: Operation, context: SessionContext) -> None:
        self.applied += 1


def make_counting_sink(settings: Settings) -> _Counting:
    """A factory ``(settings) -> sink``."""
    return _Counting(f"counting-{settings.app_id}")


def _write(session_id: str, text: str) -> None:
    append_record("sync-pair", {"call": "write_actions", "session_id": session_id, "text": text})


def _overwrite(session_id: str, summary: str) -> None:
    append_record(
        "sync-pair", {"call": "overwrite_with_summary", "session_id": session_id, "text": summary}
    )


# A plain synchronous pair, as SDK users often have.
sync_pair = SimpleNamespace(write_actions=_write, overwrite_with_summary=_overwrite)


def closing_check(settings: Settings) -> Any:
    """The built-in HTTP sink ``AC_CLOSE_CHECK_SINK`` names (intercom, webhook); at exit
    it records whether the sink's HTTP client was closed, in ``<name>-closed.jsonl``."""
    from sinks.registry import load_sink

    sink: Any = load_sink(os.environ["AC_CLOSE_CHECK_SINK"], settings)
    client = (sink.api.http if hasattr(sink, "api") else sink.http).client
    atexit.register(lambda: append_record(f"{sink.name}-closed", {"closed": client.is_closed}))
    return sink
