"""The test sinks' record files, read while a worker appends to them."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.support.plugins import read_records
from tests.support.sink_plugins import read_plugin_records


def test_a_line_still_being_written_is_not_read_yet(tmp_path: Path) -> None:
    # CI read a recorder's file mid-write (test_llm_outage_loses_nothing_and_the_breaker_recovers:
    # "unexpected end of data"); the half line is read once it is whole.
    path = tmp_path / "records.jsonl"
    whole = orjson.dumps({"op": "summary_ready", "seq_to": 5}) + b"\n"
    half = orjson.dumps({"op": "actions_written", "text": "x" * 2000})[:1195]
    path.write_bytes(whole + half)
    assert read_records(path) == [{"op": "summary_ready", "seq_to": 5}]
    assert read_plugin_records(tmp_path, "records") == [{"op": "summary_ready", "seq_to": 5}]
    path.write_bytes(
        whole + half + orjson.dumps({"op": "actions_written", "text": "x" * 2000})[1195:] + b"\n"
    )
    assert [r["op"] for r in read_records(path)] == ["summary_ready", "actions_written"]


def test_no_file_yet_is_no_records(tmp_path: Path) -> None:
    assert read_records(tmp_path / "missing.jsonl") == []
