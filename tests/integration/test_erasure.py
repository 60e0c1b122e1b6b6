"""Erasure: `agent-context erase` removes a session from every table, changelog and
destination mid-stream, while the other sessions carry on untouched."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from schemas import DeadLetter
from sinks.files import context_file
from sinks.intercom import parse_note, session_ref
from tests.fakes.intercom_server import FakeIntercomServer
from tests.integration.test_intercom import sink_env
from tests.support.cli import cli
from tests.support.kafka_io import read_topic
from tests.support.pipeline import Pipeline, produce, pull_view
from tests.support.waiting import wait_for
from tests.support.workers import Worker

pytestmark = pytest.mark.kafka

RECORDER = "tests.support.plugins:RecordingSink"
SECRET_EMAIL = "erase.me@example.com"


def batch(sid: str, start: int, n: int, email: str | None = None) -> dict[str, Any]:
    actions = [
        {"type": "click", "description": f"Clicked button {i}", "canonical_url": "/x"}
        for i in range(start, start + n)
    ]
    return {"session_id": sid, "email": email, "conversation_id": f"conv-{sid}", "actions": actions}


async def latest_values(env: dict[str, str], changelog: str) -> dict[bytes, bytes | None]:
    """A compacted changelog's effect: the latest value of each key (None: a tombstone)."""
    latest: dict[bytes, bytes | None] = {}
    for record in await read_topic(env, changelog, prefixed=False):
        if record.key is not None:
            latest[record.key] = record.value
    return latest


def of_session(key: bytes, sid: str) -> bool:
    return key.decode(errors="replace").strip('"').split("\x1f")[0] == sid


async def test_an_erased_session_leaves_no_trace_and_the_others_are_untouched(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    async with FakeIntercomServer(token="tok-erase-0123456789") as intercom:
        for sid in ("gone", "kept"):
            intercom.add_conversation(f"conv-{sid}")
        env = {
            **worker_env,
            **sink_env(intercom),
            "AC_INTERCOM_TOKEN": "tok-erase-0123456789",
            "AC_THRESHOLD": "10",
            "AC_IDLE_TIMEOUT_S": "3600",
        }
        pipe = Pipeline(env, tmp_path, workers)
        pipeline = pipe.start_pipeline()
        files, intercom_sink = pipe.start_sink("files"), pipe.start_sink("intercom")
        pipe.start_sink(RECORDER)
        await asyncio.gather(*(w.wait_ready() for w in pipe.workers))
        await produce(
            pipe.env,
            [batch("gone", 0, 12, SECRET_EMAIL), batch("kept", 0, 12), batch("gone", 12, 3)],
        )

        async def applied(sid: str, n: int) -> bool:
            view = await pull_view(files, sid)
            return view is not None and view["actions_applied"] >= n and bool(view["summary"])

        await wait_for(lambda: applied("gone", 15), timeout=60, message="gone at the sink")
        await wait_for(
            lambda: len(intercom.visible_notes("conv-gone")) >= 2, timeout=60, message="notes"
        )
        # Mid-stream: the other session goes on while the erasure runs (found by email).
        erased = await cli(pipe.env, "erase", "--email", SECRET_EMAIL, "--reason", "T-42")
        assert erased.returncode == 0, erased.stderr
        assert erased.stdout.strip() == "erase requested: session gone"
        await produce(pipe.env, [batch("kept", 12, 5)])

        async def gone_everywhere() -> bool:
            records = pipe.records()
            return (
                await pull_view(files, "gone") is None
                and await pull_view(intercom_sink, "gone") is None
                and any(r["op"] == "session_erased" for r in records)
                and not intercom.visible_notes("conv-gone")
            )

        await wait_for(gone_everywhere, timeout=90, message="the session still somewhere")
        await wait_for(lambda: applied("kept", 17), timeout=60, message="kept goes on")

        assert not context_file(Path(pipe.env["AC_FILES_DIR"]), "gone").exists()
        kept = context_file(Path(pipe.env["AC_FILES_DIR"]), "kept").read_text("utf-8")
        assert "[17] click: Clicked button 16" in kept
        ref = session_ref("kept")
        assert any(
            (m := parse_note(p.original_body)) is not None and m.ref == ref
            for p in intercom.visible_notes("conv-kept")
        )
        # No table keeps it: every changelog's latest value for its keys is a tombstone.
        app_id = pipe.env["AC_APP_ID"]
        changelogs = [
            f"{app_id}-sessions-changelog",
            f"{app_id}-summaries-changelog",
            f"{app_id}-sink-files-contexts-changelog",
            f"{app_id}-sink-intercom-contexts-changelog",
        ]

        async def erased_from(changelog: str) -> bool:
            latest = await latest_values(pipe.env, changelog)
            mine = [v for k, v in latest.items() if of_session(k, "gone")]
            kept = any(of_session(k, "kept") and v for k, v in latest.items())
            return bool(mine) and all(v is None for v in mine) and kept

        for changelog in changelogs:  # the views answer from writes still being logged
            await wait_for(lambda name=changelog: erased_from(name), timeout=30, message=changelog)
        log = pipeline.log_text() + files.log_text()
        assert "erased session gone as requested at" in log and "(T-42)" in log
        assert SECRET_EMAIL not in log


async def test_a_malformed_erase_request_is_dead_lettered_and_the_worker_goes_on(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """A malformed erasure request is refused with its reason, like any bad payload: it
    raised out of the accumulator before, which crashed the worker on every restart."""
    pipe = Pipeline({**worker_env, "AC_THRESHOLD": "10"}, tmp_path, workers)
    pipeline, files = pipe.start_pipeline(), pipe.start_sink("files")
    await asyncio.gather(*(w.wait_ready() for w in pipe.workers))
    bad = [
        {"type": "erase", "session_id": None},
        {"type": "erase", "session_id": "after", "requested_at": "soon"},
    ]
    await produce(pipe.env, [*bad, batch("after", 0, 3)])

    async def applied() -> bool:
        view = await pull_view(files, "after")
        return view is not None and view["actions_applied"] == 3

    await wait_for(applied, timeout=60, message="the payload after the bad requests")
    letters = [
        DeadLetter.model_validate_json(r.value or b"")
        for r in await read_topic(pipe.env, "dead-letters")
    ]
    assert sorted(d.reason for d in letters) == [
        "invalid erase request: requested_at: Input should be a valid number, "
        "unable to parse string as a number",
        "invalid erase request: session_id: Input should be a valid string",
    ]
    assert "Traceback" not in pipeline.log_text()
