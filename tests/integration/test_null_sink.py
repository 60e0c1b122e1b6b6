"""The null sink delivers nothing (``Sink.delivers``): its worker keeps each session's
context for the pull view, a batch right after the last stored from its operation's
header alone (``ContextStore.append``). What it serves must be what a delivering sink's
worker serves, and survive its restart (the contexts restored from its changelog)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support.pipeline import Pipeline, expected_summary_ranges, produce, pull_view
from tests.support.waiting import wait_for
from tests.support.workers import Worker

THRESHOLD = 4


async def _views(sink: Worker, sessions: list[str]) -> dict[str, Any]:
    return {sid: await pull_view(sink, sid) for sid in sessions}


@pytest.mark.kafka
async def test_the_null_sinks_pull_view_is_a_delivering_sinks(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    pipe = Pipeline({**worker_env, "AC_THRESHOLD": str(THRESHOLD)}, tmp_path, workers)
    pipeline, files, null = (
        pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink("null")
    )  # fmt: skip
    await asyncio.gather(pipeline.wait_ready(), files.wait_ready(), null.wait_ready())
    payloads = [
        {
            "session_id": f"s-{n % 3}",
            "actions": [{"description": f"step {n}.{i}"} for i in range(1 + n % 2)],
        }
        for n in range(20)
    ]
    await produce(pipe.env, payloads)
    sessions = sorted({str(p["session_id"]) for p in payloads})
    actions = {
        sid: sum(len(p["actions"]) for p in payloads if p["session_id"] == sid) for sid in sessions
    }
    summaries = {sid: len(r) for sid, r in expected_summary_ranges(payloads, THRESHOLD).items()}

    async def caught_up(sink: Worker) -> bool:
        views = await _views(sink, sessions)
        return all(
            view is not None
            and view["actions_applied"] == actions[sid]
            and view["summaries"] == summaries[sid]
            for sid, view in views.items()
        )

    async def both() -> bool:
        return await caught_up(files) and await caught_up(null)

    await wait_for(both, timeout=90, message="every session at both sinks")
    delivered = await _views(files, sessions)
    assert await _views(null, sessions) == delivered
    # Summaries (the general path) between the appends, and raw batches after them.
    assert all(v["summary"] for v in delivered.values()), delivered
    assert any(v["actions"] for v in delivered.values()), delivered

    null.stop()
    restarted = pipe.start_sink("null")
    await restarted.wait_ready()
    await wait_for(
        lambda: caught_up(restarted), timeout=90, message="the restarted null sink's contexts"
    )
    assert await _views(restarted, sessions) == delivered
