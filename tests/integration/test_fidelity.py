"""Context fidelity: what the agent reads carries the whole session through every
close, comeback, restart and LLM failure (docs/context-fidelity.md).

Real broker, real workers, and a loopback OpenAI-compatible LLM whose answers
*count*: each summary states "N actions so far", N being the count in the
previous summary its prompt carried plus the actions in the prompt. A summary
prompted without its predecessor states too small a number, so the text the
agent reads shows every break of the rolling chain.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiokafka import AIOKafkaProducer

from schemas.ledger import LedgerLimits
from sinks.files import context_file
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.cluster import metric, scrape
from tests.support.pipeline import Pipeline, pull_view, settings_from
from tests.support.pipeline import llm_env as pipeline_llm_env
from tests.support.waiting import wait_for
from tests.support.workers import FAST_REBALANCE, Worker

pytestmark = pytest.mark.kafka

RECORDER = "tests.support.plugins:RecordingSink"
IDLE_S = 2.0
K = 10
PAGES = ["/dashboard", "/reports", "/settings/billing", "/integrations", "/help"]
_PREVIOUS = re.compile(r"Previous summary of this session.*?\n(.*?)\n\nNew actions:", re.S)
_FENCED = re.compile(r"<actions>\n(.*?)\n</actions>", re.S)  # the data, not the instructions
_COUNT = re.compile(r"(\d+) actions? so far")


def counting_reply(prompt: str) -> str:
    """The loopback LLM: adds the prompt's actions to the previous summary's count."""
    previous = _PREVIOUS.search(prompt)
    before = _COUNT.search(previous.group(1)) if previous else None
    fenced = _FENCED.search(prompt)
    actions = fenced.group(1) if fenced else ""
    new = sum(1 for line in actions.splitlines() if re.match(r"\d+\. ", line))
    session = re.search(r"Session (\S+)", actions)
    sid = session.group(1) if session else "?"
    return f"{(int(before.group(1)) if before else 0) + new} actions so far in session {sid}."


def action(sid: str, n: int) -> dict[str, Any]:
    """The ``n``-th action of a session: pages, clicks, errors and submits in a fixed pattern."""
    kind = ("pageview", "click", "error", "submit", "click")[n % 5]
    description = {
        "pageview": "User landed on the page",
        "click": f"Clicked button {n}",
        "error": "Saw error 'OAuth failed'",
        "submit": f"Submitted form {n}",
    }[kind]
    page = PAGES[(n // 3) % len(PAGES)]
    return {
        "index": n,
        "type": kind,
        "title": description,
        "description": description,
        "canonical_url": f"https://app.example.com{page}",
        "timestamp_start": 1_700_000_000.0 + n,
        "timestamp_end": 1_700_000_000.5 + n,
    }


def payload(sid: str, first: int, n: int) -> dict[str, Any]:
    return {
        "session_id": sid,
        "product_id": "p",
        "actions": [action(sid, first + i) for i in range(n)],
    }


def expected_ledger(actions: list[dict[str, Any]]) -> dict[str, Any]:
    """The facts computed from the input, independently of the ledger's code."""
    limits = LedgerLimits()
    texts = [f"{a['type']}: {a['title']} {a['description']}" for a in actions]
    return {
        "actions": len(actions),
        "pages": dict(Counter(a["canonical_url"] for a in actions)),
        "errors_total": sum(1 for t in texts if limits.is_error(t)),
        "key_actions_total": sum(1 for t in texts if limits.is_key(t)),
    }


class Session:
    """One session's script: ``(delay before, number of actions)`` steps."""

    def __init__(self, sid: str, steps: list[tuple[float, int]]) -> None:
        self.sid, self.steps = sid, steps
        self.generations: list[list[dict[str, Any]]] = [[]]  # actions per visit

    async def play(self, producer: AIOKafkaProducer, topic: str) -> None:
        sent = 0
        last = time.monotonic()
        for delay, n in self.steps:
            await asyncio.sleep(delay)  # the session's own pace (the scenario, not a wait)
            if time.monotonic() - last > IDLE_S * 2.5:  # long enough to be closed: a new visit
                self.generations.append([])
            p = payload(self.sid, sent, n)
            sent += n
            self.generations[-1].extend(p["actions"])
            await producer.send_and_wait(topic, orjson.dumps(p), key=self.sid.encode())
            last = time.monotonic()


def bulk(sid: str, total: int) -> Session:
    return Session(sid, [(0.0, 10)] * (total // 10))


async def play_all(env: dict[str, str], sessions: list[Session]) -> None:
    settings = settings_from(env)
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka_bootstrap_servers, acks="all")
    await producer.start()
    try:
        await asyncio.gather(*(s.play(producer, settings.topic("actions")) for s in sessions))
    finally:
        await producer.stop()


async def applied(sink: Worker, sid: str, n: int) -> bool:
    view = await pull_view(sink, sid)
    return view is not None and view["actions_applied"] >= n


def fully_closed(view: dict[str, Any] | None, session: Session) -> bool:
    """Every visit ended at the destination with a final summary covering all of it."""
    if view is None or not view["closed"]:
        return False
    if view["summary_covers"] != [1, len(session.generations[-1])]:
        return False
    if len(session.generations) > 1:
        previous = view["previous"]
        return bool(
            previous
            and previous["closed"]
            and previous["summary_covers"] == [1, len(session.generations[-2])]
        )
    return True


async def wait_closed(sink: Worker, sessions: list[Session], timeout: float) -> dict[str, Any]:
    views: dict[str, Any] = {}

    async def done() -> bool:
        for s in sessions:
            if not fully_closed(views.get(s.sid), s):
                views[s.sid] = await pull_view(sink, s.sid)
        return all(fully_closed(views.get(s.sid), s) for s in sessions)

    def progress() -> str:
        waiting = [s.sid for s in sessions if not fully_closed(views.get(s.sid), s)]
        return f"not closed with their whole history: {waiting}: " + str(
            {
                sid: views.get(sid)
                and {k: views[sid][k] for k in ("summary", "summary_covers", "closed")}
                for sid in waiting
            }
        )

    await wait_for(done, timeout=timeout, interval=0.5, message=progress)
    return views


def check_visit(sid: str, view: dict[str, Any], actions: list[dict[str, Any]]) -> None:
    """A closed visit: its final summary states its whole count; its facts are exact."""
    n = len(actions)
    assert view["summary"] == f"{n} actions so far in session {sid}.", (sid, view["summary"])
    assert view["actions"] == [], sid  # no raw batch outlives the final summary
    ledger = view["ledger"]
    want = expected_ledger(actions)
    got = {k: ledger[k] for k in ("actions", "errors_total", "key_actions_total")}
    got["pages"] = ledger["pages"]
    assert got == want, sid
    assert ledger["last_step"]["seq"] == n and ledger["first_step"]["seq"] == 1


def llm_env(env: dict[str, str], llm: FakeOpenAIServer, **extra: str) -> dict[str, str]:
    fast = {"AC_IDLE_TIMEOUT_S": str(IDLE_S), "AC_IDLE_CHECK_INTERVAL_S": "0.25"}
    return {**env, **pipeline_llm_env(llm, K, **{**fast, **extra})}


def check_every_summary_states_its_range(pipe: Pipeline) -> None:
    """At the recorder: every summary (rolling and final) states the count of its range,
    so each was prompted with its predecessor: the rolling chain never broke."""
    for sid, records in pipe.records_by_session().items():
        for r in records:
            if r["op"] == "summary_ready":
                assert r["summary"] == f"{r['seq_to']} actions so far in session {sid}.", (
                    sid,
                    r["seq_to"],
                    r["summary"],
                )


async def test_every_close_carries_the_whole_session(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """Sessions of 10 to 10,000 actions; a session slower than K actions per idle
    timeout; closes after gaps shorter and longer than the idle timeout, long after
    the last summary. The old code forgot the history of the slow and gappy ones."""
    gap = IDLE_S * 0.6
    big = [bulk("size-10", 10), bulk("size-100", 100), bulk("size-1000", 1000)]
    big.append(bulk("size-10000", 10_000))
    timed = [
        # 21 actions, one every 0.6x the idle timeout: never closed, never K per idle time.
        Session("slow", [(0.0, 1)] + [(gap, 1)] * 20),
        # A summary, then actions 0.6x the idle timeout apart for 3x the idle timeout.
        Session("gap-short", [(0.0, 10)] + [(gap, 1)] * 5),
        # Closed after its summary, then back: a new visit with its own final.
        Session("gap-long", [(0.0, 10), (IDLE_S * 3.5, 5)]),
    ]
    sessions = big + timed
    async with FakeOpenAIServer(reply=counting_reply) as llm:
        pipe = Pipeline(llm_env(worker_env, llm), tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        pipeline, files = started[0], started[1]
        await play_all(pipe.env, big)
        # The paced sessions start once the accumulator is past the bulk (their pace
        # is measured against the idle timeout, which a backlog would blur).
        await wait_for(
            lambda: applied(files, "size-10000", 10_000),
            timeout=120,
            interval=0.5,
            message="the bulk sessions' batches at the sink",
        )
        await play_all(pipe.env, timed)
        views = await wait_closed(files, sessions, timeout=240)

        for s in sessions:
            view = views[s.sid]
            check_visit(s.sid, view, s.generations[-1])
            if len(s.generations) > 1:
                check_visit(s.sid, view["previous"], s.generations[-2])
            # The files sink holds the same text as the pull view.
            text = context_file(Path(pipe.env["AC_FILES_DIR"]), s.sid).read_text("utf-8")
            assert text == view["text"], s.sid
            n = len(s.generations[-1])
            assert f"Summary of actions 1-{n} (final: the session went idle):" in text
            assert f"- {n} actions in " in text  # the ledger block
        assert len(views["size-10000"]["text"]) < 3_000  # bounded: a summary and its facts
        assert "Earlier visit" in views["gap-long"]["text"]
        check_every_summary_states_its_range(pipe)
        assert metric(await scrape(pipeline.url), "ac_summary_chain_breaks_total") == 0
        # Every close came within a bound of the idle timeout, under the 10,000-action
        # session's load too (the old code closed these 12-51 s after a 2 s timeout).
        closes = re.findall(r"session (\S+) idle for (\d+)s: closed", pipeline.log_text())
        assert closes and all(int(after) <= IDLE_S + 4 for _, after in closes), closes


async def test_a_session_back_while_its_final_summary_is_in_the_llm(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """Closed as idle, its final summary held in the LLM, the session comes back: the
    new visit's batches reach the agent at once, and when the old final lands it
    replaces the old visit's raw batches (the old code skipped it as stale, and the
    old visit's history vanished from the files sink)."""
    async with FakeOpenAIServer(reply=counting_reply) as llm:
        pipe = Pipeline(llm_env(worker_env, llm), tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("files")]
        await asyncio.gather(*(w.wait_ready() for w in started))
        files = started[1]
        first, second = Session("back", [(0.0, 5)]), Session("back", [(0.0, 3)])
        llm.hold()
        await play_all(pipe.env, [first])
        await wait_for(
            lambda: [r for r in llm.requests if r.session == "back" and r.completed is None],
            timeout=60,
            message="the final summary of the first visit in the LLM",
        )
        await play_all(pipe.env, [second])  # the new visit, while the LLM holds the old final

        async def new_visit_shown() -> dict[str, Any] | None:
            view = await pull_view(files, "back")
            if view is None or view["previous"] is None or view["actions_applied"] != 3:
                return None
            return view

        view = await wait_for(new_visit_shown, timeout=60, message="the new visit's batches")
        assert view["previous"]["actions_applied"] == 5 and not view["previous"]["closed"]
        assert len(view["previous"]["actions"]) == 1  # the old raw batch, still un-summarised
        llm.release()
        visits = Session("back", [])
        visits.generations = [first.generations[0], second.generations[0]]
        views = await wait_closed(files, [visits], timeout=60)
        view = views["back"]
        check_visit("back", view["previous"], first.generations[0])
        check_visit("back", view, second.generations[0])
        text = context_file(Path(pipe.env["AC_FILES_DIR"]), "back").read_text("utf-8")
        assert text == view["text"]
        assert text.index("Summary of actions 1-5 (final") < text.index("Summary of actions 1-3")
        assert not re.search(r"^\[\d+\] .* — https://", text, re.M), "a raw line outlived its visit"


async def test_history_survives_a_restart_onto_a_backlog_a_rebalance_and_an_llm_outage(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """A pipeline worker killed and replaced by two onto a backlog (a rebalance shares
    it out), longer after the last summary than twice the idle timeout; an LLM outage
    whose actions were carried forward. Each session's final summary states all of it."""
    env = {**FAST_REBALANCE, "AC_LLM_RETRY_BUDGET_S": "1", "AC_LLM_RETRY_MAX_WAIT_S": "0.2"}
    async with FakeOpenAIServer(reply=counting_reply) as llm:
        pipe = Pipeline(llm_env(worker_env, llm, **env), tmp_path, workers)
        started = [pipe.start_pipeline(), pipe.start_sink("files"), pipe.start_sink(RECORDER)]
        await asyncio.gather(*(w.wait_ready() for w in started))
        first_pipeline, files = started[0], started[1]
        restart = Session("restart", [(0.0, 10)])
        outage = Session("outage", [(0.0, 10)])
        await play_all(pipe.env, [restart, outage])
        for s in (restart, outage):
            await wait_for(lambda s=s: summarised_to(files, s.sid, 10), timeout=60)

        # The LLM fails: the summary of outage 11-20 gives up and its actions are carried.
        llm.fail_always("500")
        more = Session("outage", [(0.0, 10)])
        await play_all(pipe.env, [more])

        async def gave_up() -> bool:
            text = await scrape(first_pipeline.url)
            return metric(text, "ac_summaries_total", outcome="failed") >= 1

        await wait_for(gave_up, timeout=60, message="a summary given up after its retry budget")
        llm.recover()
        # Then the pipeline dies; actions wait in the log while no worker runs.
        first_pipeline.kill()
        backlog = [Session("outage", [(0.0, 10)]), Session("restart", [(0.0, 5)])]
        await play_all(pipe.env, backlog)
        await asyncio.sleep(IDLE_S * 2.5)  # the scenario: down for longer than 2x idle
        # Two workers come back at once: the backlog is shared out by a rebalance, and
        # every close below happens after it, on whichever worker got the session.
        replacements = [pipe.start_pipeline(), pipe.start_pipeline()]
        await asyncio.gather(*(w.wait_ready() for w in replacements))

        restart.generations = [restart.generations[0] + backlog[1].generations[0]]
        outage.generations = [
            outage.generations[0] + more.generations[0] + backlog[0].generations[0]
        ]
        views = await wait_closed(files, [restart, outage], timeout=120)
        for s in (restart, outage):
            check_visit(s.sid, views[s.sid], s.generations[0])
        check_every_summary_states_its_range(pipe)
        for worker in replacements:
            assert metric(await scrape(worker.url), "ac_summary_chain_breaks_total") == 0


async def summarised_to(sink: Worker, sid: str, n: int) -> bool:
    view = await pull_view(sink, sid)
    return view is not None and (view["summary_covers"] or [0, 0])[1] >= n
