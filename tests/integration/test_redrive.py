"""Re-driving a sink's refused operations, and linking a session, end to end.

An Intercom conversation that does not exist yet: the Intercom sink retries for
``AC_INTERCOM_NOT_FOUND_GRACE_S`` and then dead-letters the session's operations.
Once the conversation exists, a link (``agent-context link``) or a re-drive
(``agent-context dead-letters redrive --stage sink-intercom``) brings the
session's context there; another sink never sees anything twice.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from schemas import DeadLetter
from sinks.base import PermanentSinkError
from sinks.context import SessionContext
from sinks.intercom import html_to_text, parse_note, session_ref
from tests.fakes.intercom_server import FakeIntercomServer, Part
from tests.integration.test_intercom import TOKEN, make_sink, markers, sink_env, summary, written
from tests.support.cli import cli
from tests.support.kafka_io import read_topic, uncommitted
from tests.support.pipeline import Pipeline, produce, pull_view
from tests.support.waiting import wait_for
from tests.support.workers import Worker

THRESHOLD = 4
RECORDER = "tests.support.plugins:RecordingSink"


def payloads_of(sid: str, conversation: str, batches: int = 3) -> list[dict[str, Any]]:
    """``batches`` payloads of two actions each, every one naming the conversation."""
    out = []
    for b in range(batches):
        actions = [
            {
                "title": f"{sid} step {2 * b + i + 1}",
                "description": f"{sid} did step {2 * b + i + 1}",
                "canonical_url": "https://app.example.com/p/:id",
                "index": 2 * b + i,
                "type": "click",
                "timestamp_start": 1.7e9 + 2 * b + i,
                "timestamp_end": 1.7e9 + 2 * b + i + 0.5,
                "session_id": sid,
            }
            for i in range(2)
        ]
        out.append(
            {
                "type": "actions",
                "product_id": "prod-1",
                "session_id": sid,
                "conversation_id": conversation,
                "actions": actions,
                "count": 2,
                "forwarded_at": 1.7e9,
            }
        )
    return out


def session_notes(server: FakeIntercomServer, sid: str) -> list[Part]:
    ref = session_ref(sid)
    return [
        p
        for p in server.notes(f"conv-{sid}")
        if (m := parse_note(p.original_body)) is not None and m.ref == ref
    ]


async def sink_letters(env: dict[str, str]) -> list[DeadLetter]:
    records = await read_topic(env, "dead-letters")
    letters = [DeadLetter.model_validate_json(r.value or b"") for r in records]
    return [letter for letter in letters if letter.stage == "sink-intercom"]


async def holds_the_context(server: FakeIntercomServer, sink: Worker, sid: str) -> bool:
    """The conversation's visible notes hold the sink's whole context for ``sid``, in order:
    the summary (actions 1 to its range), then every raw batch after it."""
    view = await pull_view(sink, sid)
    visible = [p for p in session_notes(server, sid) if not p.redacted]
    if view is None or not visible or not view["summary"]:
        return False
    text = "\n".join(html_to_text(p.body) for p in visible)
    expected = [view["summary"], *(batch["text"] for batch in view["actions"])]
    positions = [text.find(part.strip().splitlines()[0]) for part in expected]
    return all(p >= 0 for p in positions) and positions == sorted(positions)


@pytest.mark.kafka
async def test_refused_operations_come_back_to_their_sink_on_a_link_or_a_redrive(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    linked, redriven = "rd-link", "rd-redrive"
    env = {**worker_env, "AC_THRESHOLD": str(THRESHOLD), "AC_IDLE_TIMEOUT_S": "3600"}
    async with FakeIntercomServer(token=TOKEN) as server:
        pipe = Pipeline(env, tmp_path, workers)
        intercom_env = {**sink_env(server), "AC_INTERCOM_NOT_FOUND_GRACE_S": "1"}
        started = [
            pipe.start_pipeline(),
            pipe.start_sink("intercom", **intercom_env),
            pipe.start_sink(RECORDER),
        ]
        await asyncio.gather(*(w.wait_ready() for w in started))
        sink = started[1]
        # Neither conversation exists yet: 3 batches and a summary each, all refused.
        await produce(pipe.env, payloads_of(linked, f"conv-{linked}"))
        await produce(pipe.env, payloads_of(redriven, f"conv-{redriven}"))
        letters: list[DeadLetter] = []

        async def all_refused() -> bool:
            letters[:] = await sink_letters(pipe.env)
            return len(letters) == 8

        await wait_for(all_refused, timeout=120, interval=0.5, message=lambda: str(letters))
        assert server.notes(f"conv-{linked}") == []
        server.add_conversation(f"conv-{linked}")
        server.add_conversation(f"conv-{redriven}")

        # A link for the first session re-delivers its context (one catch-up note).
        done = await cli(pipe.env, "link", linked, f"conv-{linked}")
        assert done.returncode == 0, done.stderr
        assert f"linked session {linked} to conversation conv-{linked}" in done.stdout
        await wait_for(lambda: holds_the_context(server, sink, linked), timeout=60, interval=0.3)

        # The re-drive brings the other one's; the linked one's are applied, not posted again.
        done = await cli(pipe.env, "dead-letters", "redrive", "--stage", "sink-intercom")
        assert done.returncode == 0, done.stderr
        target = pipe.env["AC_TOPIC_PREFIX"] + "redrive.sink-intercom"
        assert f"re-driven into {target}: 8" in done.stdout, done.stdout
        await wait_for(lambda: holds_the_context(server, sink, redriven), timeout=60, interval=0.3)

        # Let the re-driven operations all go through the sink: the dead letters' re-drive
        # group is done and the sink's consumer committed past them (no more refusals).
        async def redrive_consumed() -> bool:
            group = f"{pipe.env['AC_APP_ID']}-sink-intercom"
            return not await uncommitted(pipe.env, [(group, ["redrive.sink-intercom"])])

        await wait_for(redrive_consumed, timeout=60, interval=0.5)
        for sid in (linked, redriven):
            kinds = [markers([p])[0] for p in session_notes(server, sid)]
            assert kinds == [("catch-up", 1, 6)], (sid, kinds)  # once, whole, nothing twice
        assert len(await sink_letters(pipe.env)) == 8  # nothing refused again

        # The other sink got every operation exactly once, in order, never re-driven.
        records = pipe.records()
        seen = Counter((r["session_id"], r["op"], r["seq_from"], r["seq_to"]) for r in records)
        assert len(records) == 8 and set(seen.values()) == {1}, records
        for sid in (linked, redriven):
            ops = [(r["op"], r["seq_to"]) for r in records if r["session_id"] == sid]
            assert ops == [
                ("actions_written", 2),
                ("actions_written", 4),
                ("summary_ready", 4),
                ("actions_written", 6),
            ] or ops == [
                ("actions_written", 2),
                ("actions_written", 4),
                ("actions_written", 6),
                ("summary_ready", 4),
            ], ops

        # Re-driving again finds nothing new; a wrong link is one clear line.
        again = await cli(pipe.env, "dead-letters", "redrive", "--stage", "sink-intercom")
        assert "examined 0 dead letters" in again.stdout, again.stdout
        wrong = await cli(pipe.env, "link", "", "conv-x")
        assert wrong.returncode == 1 and wrong.stderr.count("\n") == 1, wrong.stderr
        assert wrong.stderr.startswith("error: ") and "session_id" in wrong.stderr


async def test_a_redriven_summary_after_a_catch_up_is_not_posted_twice() -> None:
    """In process, as the runner does it: refused operations still advance the saved
    context; once the conversation exists, the first re-driven operation posts the
    context as one note and the rest (the summary included) add nothing."""
    async with FakeIntercomServer(token=TOKEN) as server:
        sink = make_sink(server, not_found_grace_s=0)
        ops = [written("s", 1, 2), written("s", 3, 4), summary("s", 4), written("s", 5, 6)]
        context = SessionContext(session_id="s")
        for op in ops:
            context = context.advanced(op)
            with pytest.raises(PermanentSinkError):
                await sink.apply(op, context)
        assert server.notes("c1") == []
        server.add_conversation("c1")
        for op in ops:  # the re-drive: each op with the current context
            context = context.copy()
            await sink.apply(op, context)
        assert markers(server.visible_notes("c1")) == [("catch-up", 1, 6)]
        [note] = server.visible_notes("c1")
        assert "summary of 1-4" in note.body and "batch 5-6" in note.body
