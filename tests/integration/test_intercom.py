"""The Intercom sink against a loopback Intercom: in process, then end to end on a real broker."""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import orjson
import pytest
from aiokafka import AIOKafkaProducer

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import ActionsPayload, ActionsWritten, SessionLink, SummaryReady
from sinks._http import TransientHTTPError
from sinks.base import LinkAwareSink, PermanentSinkError
from sinks.context import SessionContext, Skip
from sinks.intercom import (
    IntercomAPI,
    IntercomSettings,
    IntercomSink,
    note_body,
    parse_note,
    session_ref,
)
from streams.retry import retry_after
from streams.settings import ConfigurationError
from tests.fakes.intercom_server import FakeIntercomServer, Part
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.pipeline import (
    Pipeline,
    batches_by_session,
    expected_summary_ranges,
    produce,
    settings_from,
)
from tests.support.pipeline import llm_env as pipeline_llm_env
from tests.support.waiting import wait_for
from tests.support.workers import FAST_REBALANCE, ROOT, Worker

TOKEN = "tok-SECRET-0123456789abcdef"
ADMIN = "991266414"


# --------------------------------------------------------------------------- in process


def make_sink(server: FakeIntercomServer, **overrides: Any) -> IntercomSink:
    settings = IntercomSettings(
        token=TOKEN, admin_id=ADMIN, api_base=server.url, timeout_s=2.0, **overrides
    )
    return IntercomSink(IntercomAPI(settings))


def written(sid: str, a: int, b: int, conv: str | None = "c1", at: float = 1.7e9) -> ActionsWritten:
    return ActionsWritten(
        session_id=sid,
        conversation_id=conv,
        seq_from=a,
        seq_to=b,
        text=f"Session {sid} — batch {a}-{b}\n[0] click: <b>Export</b> & more",
        payload=ActionsPayload(session_id=sid),
        emitted_at=at,
    )


def summary(sid: str, to: int, conv: str | None = "c1", text: str | None = None) -> SummaryReady:
    return SummaryReady(
        session_id=sid,
        conversation_id=conv,
        seq_from=1,
        seq_to=to,
        window_from=1,
        summary=text or f"summary of 1-{to}",
        emitted_at=1.7e9,
    )


class MiniRunner:
    """The runner's contract in process: advance, apply with retries, save after apply returns."""

    def __init__(self, sink: IntercomSink) -> None:
        self.sink = sink
        self.saved: dict[str, SessionContext] = {}

    def load(self, sid: str) -> SessionContext:
        return self.saved.get(sid) or SessionContext(session_id=sid)

    async def _retry(self, call: Callable[[], Awaitable[None]], attempts: int = 20) -> None:
        for attempt in range(attempts):
            try:
                return await call()
            except PermanentSinkError:
                raise
            except Exception:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.01)  # the retry's backoff (the runner's, shortened)

    async def apply(self, op: ActionsWritten | SummaryReady, *, save: bool = True) -> None:
        try:
            context = self.load(op.session_id).advanced(op)
        except Skip:
            return
        await self._retry(lambda: self.sink.apply(op, context))
        if save:
            self.saved[op.session_id] = context

    async def link(self, sid: str, conv: str, *, save: bool = True) -> None:
        context = self.load(sid).copy()
        await self._retry(lambda: self.sink.link(sid, conv, context))
        if save:
            self.saved[sid] = context


def markers(parts: list[Part]) -> list[tuple[str, int, int]]:
    out = []
    for part in parts:
        marker = parse_note(part.original_body)
        assert marker is not None
        out.append((marker.kind, marker.seq_from, marker.seq_to))
    return out


def test_note_body_is_escaped_html_with_a_parseable_marker() -> None:
    body = note_body("s<1>", 7, "actions", 3, 5, "line <a>\nline & 2\n\nnext para", 1.7e9)
    assert body.startswith("<p>session_id: s&lt;1&gt;<br>timestamp: 2023-11-14 22:13:20 UTC<br>")
    assert "<p>line &lt;a&gt;<br>line &amp; 2</p><p>next para</p>" in body
    marker = parse_note(body)
    assert marker is not None
    assert (marker.kind, marker.seq_from, marker.seq_to, marker.generation) == ("actions", 3, 5, 7)
    assert marker.ref == session_ref("s<1>")
    assert parse_note("<p>a note a human wrote</p>") is None
    # Control and bidi characters become visible escapes (the old code passed them on).
    hostile = note_body("s\u202e", 1, "summary", 1, 2, "NUL \x00 BEL \x07 ESC \x1b DEL \x7f", 1.7e9)
    assert "s\\u202e" in hostile and "NUL \\x00 BEL \\x07 ESC \\x1b DEL \\x7f" in hostile
    assert all(ch.isprintable() for ch in hostile)


def test_settings_name_what_is_missing_and_never_show_the_token(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key in list(os.environ):
        if key.startswith("AC_INTERCOM_"):
            monkeypatch.delenv(key)
    with pytest.raises(ConfigurationError) as missing:
        IntercomSettings.load()
    assert "AC_INTERCOM_TOKEN" in str(missing.value)
    assert "AC_INTERCOM_ADMIN_ID" in str(missing.value)
    monkeypatch.setenv("AC_INTERCOM_TOKEN", TOKEN)
    monkeypatch.setenv("AC_INTERCOM_ADMIN_ID", ADMIN)
    monkeypatch.setenv("AC_INTERCOM_TIMEOUT_S", "-1")
    with pytest.raises(ConfigurationError) as bad:
        IntercomSettings.load()
    assert "AC_INTERCOM_TIMEOUT_S" in str(bad.value) and TOKEN not in str(bad.value)
    monkeypatch.delenv("AC_INTERCOM_TIMEOUT_S")
    # No scheme: the old code took it, then failed every request (UnsupportedProtocol).
    monkeypatch.setenv("AC_INTERCOM_API_BASE", "api.intercom.io")
    with pytest.raises(ConfigurationError) as no_scheme:
        IntercomSettings.load()
    assert str(no_scheme.value) == (
        "invalid setting AC_INTERCOM_API_BASE: 'api.intercom.io' is not an http:// or "
        "https:// URL with a host"
    )
    monkeypatch.delenv("AC_INTERCOM_API_BASE")
    settings = IntercomSettings.load()
    sink = IntercomSink(IntercomAPI(settings))
    assert TOKEN not in repr(settings) + repr(sink) + repr(sink.api.http.client.auth)


def test_rate_limit_delay_comes_from_the_headers() -> None:
    reset = "X-RateLimit-Reset"
    assert retry_after({"x-ratelimit-reset": "1010"}, now=1000.0, reset_header=reset) == 10.0
    assert retry_after({"x-ratelimit-reset": "999"}, now=1000.0, reset_header=reset) == 0.05
    assert retry_after({"x-ratelimit-reset": "999"}, now=1000.0) is None  # not asked for
    assert retry_after({"Retry-After": "3"}, now=1000.0) == 3.0
    assert retry_after({"retry-after-ms": "250", "retry-after": "3"}) == 0.25
    assert retry_after({"retry-after": "Thu, 01 Jan 1970 00:16:50 GMT"}, now=1000.0) == 10.0
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None


async def test_summary_goes_first_and_redacts_only_what_it_covers() -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c1")
        runner = MiniRunner(make_sink(server))
        assert isinstance(runner.sink, LinkAwareSink)
        for a, b in ((1, 3), (4, 6), (7, 9)):
            await runner.apply(written("s", a, b))
        await runner.apply(summary("s", 6))  # 7-9 arrived while the LLM was busy
        visible = markers(server.visible_notes("c1"))
        assert visible == [("actions", 7, 9), ("summary", 1, 6)]
        await runner.apply(written("s", 10, 12))
        await runner.apply(summary("s", 12))  # replaces the previous summary note
        assert markers(server.visible_notes("c1")) == [("summary", 1, 12)]
        # The summary note was answered before the first redaction arrived.
        replies = [c for c in server.calls if c.kind == "reply"]
        redacts = [c for c in server.calls if c.kind == "redact"]
        summary_12 = next(c for c in replies if "summary of actions 1-12" in c.body["body"])
        assert summary_12.completed is not None
        assert all(summary_12.completed <= r.arrived for r in redacts[-3:])
        body = server.notes("c1")[0].original_body
        assert "&lt;b&gt;Export&lt;/b&gt; &amp; more" in body
        # Every call carried the token and the version; bookkeeping is bounded.
        assert all(c.status != 401 for c in server.calls)
        extra = runner.saved["s"].extra
        assert [(n["kind"], n["seq_to"]) for n in extra["notes"]] == [("summary", 12)]
        assert extra["to_redact"] == [] and extra["pending_summary"] is None


async def test_a_late_final_summary_of_the_previous_generation_retires_its_notes() -> None:
    """The session came back while its final summary was still in the LLM: the new
    generation's notes go up first; the old final summary must still replace the old
    generation's raw notes (the old code skipped it as a replay and left them up)."""
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c1")
        runner = MiniRunner(make_sink(server))
        await runner.apply(written("s", 1, 3))
        await runner.apply(summary("s", 3))
        await runner.apply(written("s", 4, 5))  # then idle: its final (1-5) is in the LLM
        came_back = written("s", 1, 2).model_copy(update={"generation": 77})
        await runner.apply(came_back)
        final = summary("s", 5, text="all five").model_copy(update={"final": True})
        await runner.apply(final)
        visible = [
            (m.generation, m.kind, m.seq_from, m.seq_to)
            for m in (parse_note(p.original_body) for p in server.visible_notes("c1"))
            if m is not None
        ]
        assert sorted(visible) == [(0, "summary", 1, 5), (77, "actions", 1, 2)]
        await runner.apply(final)  # a replay: nothing posted twice
        assert len(server.visible_notes("c1")) == 2


async def test_a_crash_after_the_summary_neither_reposts_it_nor_forgets_redactions() -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c1")
        runner = MiniRunner(make_sink(server, attempts=1))
        for a, b in ((1, 3), (4, 6)):
            await runner.apply(written("s", a, b))
        before = runner.load("s")
        # Summary posted, then every redaction fails, then the process dies.
        server.fail("ok", "500", "500")
        context = before.advanced(summary("s", 6))
        with pytest.raises(TransientHTTPError):
            await runner.sink.apply(summary("s", 6), context)
        assert len(context.extra["to_redact"]) == 2  # progress is in extra for a retry
        # A new process gets the context saved before the summary (the runner
        # saves only after apply returns) and the summary op again.
        restarted = MiniRunner(make_sink(server))
        restarted.saved = {"s": before}
        gets_before = len(server.answered("get"))
        await restarted.apply(summary("s", 6))
        assert markers(server.notes("c1")) == [
            ("actions", 1, 3),
            ("actions", 4, 6),
            ("summary", 1, 6),
        ]
        assert markers(server.visible_notes("c1")) == [("summary", 1, 6)]
        # One look at the conversation after the restart, no more.
        assert len(server.answered("get")) == gets_before + 1


async def test_a_post_whose_outcome_is_unknown_is_looked_up_not_repeated() -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c1")
        runner = MiniRunner(make_sink(server))
        await runner.apply(written("s", 1, 2))
        server.fail("500-after")  # the note lands, the answer says 500
        await runner.apply(written("s", 3, 4))
        # Crash after a successful post, before the context was saved:
        await runner.apply(written("s", 5, 6), save=False)
        restarted = MiniRunner(make_sink(server))
        restarted.saved = dict(runner.saved)
        await restarted.apply(written("s", 5, 6))
        await restarted.apply(summary("s", 6))
        assert markers(server.notes("c1")) == [
            ("actions", 1, 2),
            ("actions", 3, 4),
            ("actions", 5, 6),
            ("summary", 1, 6),
        ]
        assert markers(server.visible_notes("c1")) == [("summary", 1, 6)]


async def test_actions_before_the_link_are_posted_as_one_note_when_it_arrives() -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c9")
        runner = MiniRunner(make_sink(server))
        for a, b in ((1, 3), (4, 6), (7, 8)):
            await runner.apply(written("s", a, b, conv=None))
        await runner.apply(summary("s", 6, conv=None))
        assert server.calls == []  # nothing posted while unlinked
        await runner.link("s", "c9")
        [note] = server.visible_notes("c9")
        assert markers([note]) == [("catch-up", 1, 8)]
        assert "summary of 1-6" in note.body and "batch 7-8" in note.body
        assert "batch 1-3" not in note.body  # summarised: not twice
        await runner.link("s", "c9")  # a duplicate link changes nothing
        await runner.apply(written("s", 9, 10, conv=None))
        await runner.apply(summary("s", 10, conv=None))
        assert markers(server.visible_notes("c9")) == [("summary", 1, 10)]
        # The same link replayed by a new process (crash before the save): no second catch-up.
        restarted = MiniRunner(make_sink(server))
        restarted.saved = {"s": msgspec.structs.replace(runner.saved["s"].copy(), extra={})}
        posted = len(server.notes("c9"))
        await restarted.link("s", "c9")
        assert len(server.notes("c9")) == posted


async def test_a_session_that_comes_back_keeps_its_conversation() -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c5")
        runner = MiniRunner(make_sink(server))
        await runner.link("s", "c5")
        await runner.apply(written("s", 1, 3, conv=None))
        closing = summary("s", 3, conv=None).model_copy(update={"final": True})
        await runner.apply(closing)
        # The session idled out; it comes back as a new generation, numbered from 1.
        again = written("s", 1, 2, conv=None).model_copy(update={"generation": 77})
        await runner.apply(again)
        visible = server.visible_notes("c5")
        assert markers(visible) == [("summary", 1, 3), ("actions", 1, 2)]
        assert [parse_note(p.body).generation for p in visible] == [0, 77]  # type: ignore[union-attr]


async def test_rate_limits_wait_for_the_reset_and_errors_are_classified(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with FakeIntercomServer(token=TOKEN) as server:
        server.add_conversation("c1")
        runner = MiniRunner(make_sink(server))
        server.storm(1.0, reset_s=1, retry_after=True)
        started = time.monotonic()
        task = asyncio.create_task(runner.apply(written("s", 1, 1)))
        await wait_for(lambda: len(server.calls) >= 2, timeout=10)
        server.recover()
        await task
        assert time.monotonic() - started >= 0.9  # waited for Retry-After, not hammering
        assert markers(server.visible_notes("c1")) == [("actions", 1, 1)]

        # A 400 on a note is a refusal; a 404/400-not-redactable redact is done.
        server.fail("400")
        context = runner.load("s").advanced(written("s", 2, 2))
        with pytest.raises(PermanentSinkError):
            await runner.sink.apply(written("s", 2, 2), context)
        assert await runner.sink.api.redact("c1", "no-such-part") is True
        first = server.visible_notes("c1")[0].id
        assert await runner.sink.api.redact("c1", first) is True
        assert await runner.sink.api.redact("c1", first) is True  # not redactable any more

        # A wrong token: retried (an outage to fix), and never in the error or the logs.
        bad = IntercomSink(
            IntercomAPI(
                IntercomSettings(token="tok-WRONG-SECRET-42", admin_id=ADMIN, api_base=server.url)
            )
        )
        caplog.set_level(logging.DEBUG)
        with pytest.raises(TransientHTTPError) as unauthorized:
            await bad.apply(written("s", 3, 3), runner.load("s").advanced(written("s", 3, 3)))
        assert unauthorized.value.status == 401
        assert "tok-WRONG-SECRET-42" not in str(unauthorized.value) + caplog.text


# --------------------------------------------------------------------------- end to end


def sink_env(server: FakeIntercomServer) -> dict[str, str]:
    return {
        **FAST_REBALANCE,
        "AC_INTERCOM_TOKEN": TOKEN,
        "AC_INTERCOM_ADMIN_ID": ADMIN,
        "AC_INTERCOM_API_BASE": server.url,
        "AC_INTERCOM_TIMEOUT_S": "3",
    }


def llm_env(env: dict[str, str], llm: FakeOpenAIServer, threshold: int) -> dict[str, str]:
    return {**env, **pipeline_llm_env(llm, threshold)}


async def actions_applied(sink: Worker, sid: str) -> int:
    """How far the sink's context of ``sid`` goes (its pull view), 0 before it has one."""
    async with httpx.AsyncClient(timeout=5) as client:
        response = await client.get(f"{sink.url}/sessions/{sid}/context")
    return int(response.json()["actions_applied"]) if response.status_code == 200 else 0


def conversation_of(sid: str) -> str:
    return f"conv-{sid}"


def with_conversations(payloads: list[dict[str, Any]], late: set[str]) -> list[dict[str, Any]]:
    """Sessions not in ``late`` carry their conversation on every payload."""
    out = []
    for p in payloads:
        p = copy.deepcopy(p)
        if p["session_id"] not in late:
            p["conversation_id"] = conversation_of(p["session_id"])
        out.append(p)
    return out


async def produce_links(env: dict[str, str], sessions: list[str]) -> None:
    settings = settings_from(env)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        for sid in sessions:
            link = SessionLink(session_id=sid, conversation_id=conversation_of(sid), linked_at=1.0)
            await producer.send_and_wait(
                settings.topic("links"), orjson.dumps(link.model_dump()), key=sid.encode()
            )
    finally:
        await producer.stop()


def totals(payloads: list[dict[str, Any]]) -> dict[str, int]:
    return {
        sid: sum(len(p["actions"]) for p in ps) for sid, ps in batches_by_session(payloads).items()
    }


def note_log(server: FakeIntercomServer, sid: str) -> list[tuple[Part, tuple[str, int, int]]]:
    """The session's notes in posting order, with their markers."""
    ref = session_ref(sid)
    out = []
    for part in server.notes(conversation_of(sid)):
        marker = parse_note(part.original_body)
        if marker is not None and marker.ref == ref:
            out.append((part, (marker.kind, marker.seq_from, marker.seq_to)))
    return out


def unsettled(
    server: FakeIntercomServer, payloads: list[dict[str, Any]], threshold: int
) -> dict[str, str]:
    """Per session not yet settled (the last summary note up, every later action
    noted, nothing stale left), what its conversation shows instead."""
    crossings = expected_summary_ranges(payloads, threshold)
    waiting = {}
    for sid, total in totals(payloads).items():
        visible = [m for part, m in note_log(server, sid) if not part.redacted]
        last = crossings[sid][-1] if crossings[sid] else 0
        summaries = [m for m in visible if m[0] == "summary"]
        rest = sorted(m for m in visible if m[0] != "summary")
        covered = [n for m in rest for n in range(m[1], m[2] + 1)]
        if (last and summaries != [("summary", 1, last)]) or covered != list(
            range(last + 1, total + 1)
        ):
            waiting[sid] = f"expected summary 1-{last} and actions to {total}; visible {visible}"
    return waiting


def settled(server: FakeIntercomServer, payloads: list[dict[str, Any]], threshold: int) -> bool:
    return not unsettled(server, payloads, threshold)


def not_settled_yet(
    server: FakeIntercomServer, payloads: list[dict[str, Any]], threshold: int
) -> str:
    """The timeout message of a wait for ``settled``: what each late session shows."""
    waiting = unsettled(server, payloads, threshold)
    lines = [f"{sid}: {why}" for sid, why in sorted(waiting.items())]
    return f"calls so far: {len(server.calls)}; not settled:\n" + "\n".join(lines)


def check_destination(
    server: FakeIntercomServer,
    payloads: list[dict[str, Any]],
    threshold: int,
    dump: Path,
) -> None:
    """The destination's invariants; on failure the call log is kept in ``dump``."""
    try:
        _check_destination(server, payloads, threshold)
    except AssertionError:
        with dump.open("wb") as handle:
            for call in server.calls:
                record = {k: v for k, v in vars(call).items() if k != "body"}
                marker = parse_note(call.body.get("body")) if call.kind == "reply" else None
                record["marker"] = marker.model_dump() if marker else None
                handle.write(orjson.dumps(record) + b"\n")
        raise


def _check_destination(
    server: FakeIntercomServer,
    payloads: list[dict[str, Any]],
    threshold: int,
) -> None:
    crossings = expected_summary_ranges(payloads, threshold)
    want = totals(payloads)
    for sid in want:
        log_ = note_log(server, sid)
        kinds = [m for _, m in log_]
        # No note posted twice (same kind and range, or the same body).
        assert len(kinds) == len(set(kinds)), f"{sid}: a note was posted twice: {kinds}"
        bodies = [p.original_body for p, _ in log_]
        assert len(bodies) == len(set(bodies)), sid
        # Raw notes (and a catch-up) hold every action exactly once, in order.
        raw = [m for m in kinds if m[0] != "summary"]
        seqs = [n for m in raw for n in range(m[1], m[2] + 1)]
        assert seqs == sorted(set(seqs)), f"{sid}: raw notes overlap or out of order: {raw}"
        first = raw[0][1] if raw[0][0] == "catch-up" else 1
        missing = sorted(set(range(first, want[sid] + 1)) - set(seqs))
        assert not missing, f"{sid}: actions {missing} never noted: {raw}"
        # Summary notes appear in order, one per crossing (a late link may skip early ones).
        summaries = [m[2] for m in kinds if m[0] == "summary"]
        assert summaries == sorted(summaries) and set(summaries) <= set(crossings[sid]), sid
        assert summaries[-1] == crossings[sid][-1], sid
        # Every redaction came after a summary note covering it was confirmed.
        summary_done: list[tuple[float, int]] = []
        part_marker = {p.id: m for p, m in log_}
        conversation = conversation_of(sid)
        for call in server.calls:
            if call.conversation_id != conversation:
                continue
            if call.kind == "reply" and call.status == 200 and call.part_id in part_marker:
                kind, _, seq_to = part_marker[call.part_id]
                if kind == "summary":
                    assert call.completed is not None
                    summary_done.append((call.completed, seq_to))
            if call.kind == "redact" and call.part_id in part_marker:
                _, _, seq_to = part_marker[call.part_id]
                covering = [t for t, to in summary_done if to >= seq_to and t <= call.arrived]
                assert covering, f"{sid}: part {call.part_id} redacted before a summary covered it"
    assert settled(server, payloads, threshold)


def session_payloads(count: int, mean_length: int, seed: int) -> list[dict[str, Any]]:
    plans = plan_sessions(count, mean_length=mean_length, seed=seed)
    return list(interleaved_payloads(plans, seed=seed))


@pytest.mark.kafka
async def test_intercom_end_to_end_with_a_late_link_and_a_rate_limit_storm(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 8
    raw = session_payloads(8, mean_length=30, seed=21)
    sids = list(totals(raw))
    late = {sids[0], sids[1]}
    payloads = with_conversations(raw, late)
    # The late sessions' links are produced after a part of the stream.
    split = len(payloads) // 3
    async with FakeOpenAIServer(latency_s=0.4) as llm, FakeIntercomServer(token=TOKEN) as server:
        for sid in sids:
            server.add_conversation(conversation_of(sid))
        pipe = Pipeline(llm_env(worker_env, llm, threshold), tmp_path, workers)
        sink = pipe.start_sink("intercom", **sink_env(server))
        started = [pipe.start_pipeline(), sink]
        await asyncio.gather(*(w.wait_ready() for w in started))
        server.storm(0.3, reset_s=1)
        await produce(pipe.env, payloads[:split])
        await wait_for(lambda: len(server.answered("reply")) >= 10, timeout=60)
        # The link lands mid-stream: after the late sessions' first actions reached the
        # sink (so they wait for it), before their later summaries. Were it applied after
        # a session's last summary, its catch-up note would hold that summary for good,
        # a valid end the checks below do not expect (a race the test used to leave open).
        early = totals(payloads[:split])
        seen: dict[str, int] = {}

        async def early_actions_applied() -> bool:
            for sid in late:
                seen[sid] = await actions_applied(sink, sid)
            return all(seen[sid] == early[sid] for sid in late)

        await wait_for(
            early_actions_applied, timeout=60, message=lambda: f"applied {seen} of {early}"
        )
        await produce_links(pipe.env, sorted(late))
        await wait_for(
            lambda: all(any(m[0] == "catch-up" for _, m in note_log(server, s)) for s in late),
            timeout=60,
            message=lambda: str({s: note_log(server, s) for s in late}),
        )
        await produce(pipe.env, payloads[split:])
        await wait_for(
            lambda: settled(server, payloads, threshold),
            timeout=150,
            interval=0.5,
            message=lambda: not_settled_yet(server, payloads, threshold),
        )
        storm_calls = [c for c in server.calls if c.status == 429]
        assert len(storm_calls) >= 10, "the storm did not happen"
        check_destination(server, payloads, threshold, dump=tmp_path / "intercom-calls.jsonl")
        for sid in late:
            kinds = [m[0] for _, m in note_log(server, sid)]
            assert kinds.count("catch-up") == 1, (sid, kinds)
        # Batches noted while the LLM was busy came before their summary note and were
        # left alone by it (check_destination: no note redacted before a summary covered it).
        overtaken = [
            (sid, m)
            for sid in sids
            for i, (_, m) in enumerate(note_log(server, sid))
            if m[0] == "summary"
            and any(k[0] == "actions" and k[1] > m[2] for _, k in note_log(server, sid)[:i])
        ]
        assert overtaken, "no batch arrived during an LLM call: the test proves nothing"


@pytest.mark.kafka
async def test_intercom_sink_killed_mid_stream_posts_nothing_twice(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    threshold = 6
    raw = session_payloads(10, mean_length=30, seed=33)
    payloads = with_conversations(raw, late=set())
    async with FakeOpenAIServer(latency_s=0.2) as llm, FakeIntercomServer(token=TOKEN) as server:
        for sid in totals(raw):
            server.add_conversation(conversation_of(sid))
        pipe = Pipeline(llm_env(worker_env, llm, threshold), tmp_path, workers)
        pipeline = pipe.start_pipeline()
        sink = pipe.start_sink("intercom", **sink_env(server))
        await asyncio.gather(pipeline.wait_ready(), sink.wait_ready())
        # Slow the destination a little so the kill lands mid-stream, mid-summary.
        server.storm(0.2, reset_s=1)
        await produce(pipe.env, payloads)
        total_notes = len(payloads)
        await wait_for(
            lambda: (
                len(server.answered("redact")) >= 5
                and len(server.answered("reply")) >= total_notes // 3
            ),
            timeout=90,
        )
        sink.kill()
        killed_at = len(server.calls)
        server.recover()
        restarted = pipe.start_sink("intercom", **sink_env(server))
        await restarted.wait_ready()
        await wait_for(
            lambda: settled(server, payloads, threshold),
            timeout=120,
            interval=0.5,
            message=lambda: not_settled_yet(server, payloads, threshold),
        )
        assert len(server.calls) > killed_at
        assert server.answered("get"), "the restarted sink never looked before posting"
        # A gap here, or no progress after the restart, has so far always been the
        # consumer, not the sink: faust-streaming 0.15.3 can drop or stall the first
        # uncommitted records of a worker restarting with table state (its fetcher runs
        # during recovery, before the seek to the committed offsets; see
        # streams/_faust/divert.py). The Intercom calls are in intercom-calls.jsonl.
        check_destination(server, payloads, threshold, dump=tmp_path / "intercom-calls.jsonl")


def test_the_sink_worker_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AC_INTERCOM_")}
    done = subprocess.run(
        [sys.executable, "-c", "import sinks.app"],
        cwd=ROOT,
        env={**env, "AC_SINK": "intercom", "AC_DATA_DIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "AC_INTERCOM_TOKEN" in done.stderr + done.stdout
