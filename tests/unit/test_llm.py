"""The LLM client and its resilience layer, against a real HTTP fake of the OpenAI API."""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agents.summarizer import (
    BreakerOpen,
    CircuitBreaker,
    FailureLog,
    LLMError,
    LLMUnavailable,
    OfflineSummarizer,
    OpenAIChat,
    ResilientLLM,
    build_summarizer,
    llm_session,
    load_llm_callable,
    openai_llm,
)
from agents.summarizer.deadlines import Deadlines
from streams.retry import retry_after
from streams.settings import Settings
from tests.fakes import FakeOpenAIServer
from tests.fakes.openai_server import default_reply
from tests.support.waiting import wait_for

KEY = "sk-test-" + "S3CR3TK3Y" * 3

PROMPT = "Session s1\nRecent actions:\n- opened pricing page\n- clicked 'Start trial'\n"


def make_settings(server: FakeOpenAIServer, **overrides: Any) -> Settings:
    values: dict[str, Any] = {
        "llm_api_key": KEY,
        "llm_base_url": server.base_url,
        "llm_model": "fake-gpt",
        "llm_timeout_s": 2.0,
        "llm_max_tokens": 64,
        "llm_temperature": 0.1,
    }
    values.update(overrides)
    return Settings(**values)


def resilient(llm: Any, **overrides: Any) -> ResilientLLM:
    kwargs: dict[str, Any] = {
        "concurrency": 4,
        "failure_threshold": 5,
        "reset_timeout_s": 0.5,
        "retry_budget_s": 5.0,
        "max_wait_s": 2.0,
        "attempt_timeout_s": 3.0,
        "base_wait_s": 0.01,
    }
    kwargs.update(overrides)
    return ResilientLLM(llm, **kwargs)


def metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def failures(kind: str) -> float:
    return metric("ac_llm_failures_total", kind=kind)


def full_text(exc: BaseException) -> str:
    """Everything a log line with exc_info could print about ``exc`` (chain included)."""
    return "".join(traceback.format_exception(exc)) + repr(exc) + str(exc)


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer() as fake:
        yield fake


@pytest.fixture
async def llm(server: FakeOpenAIServer) -> AsyncIterator[OpenAIChat]:
    chat = openai_llm(make_settings(server))
    yield chat
    await chat.aclose()


# -- the OpenAI client on its own ---------------------------------------------


async def test_success_returns_the_reply(server: FakeOpenAIServer, llm: OpenAIChat) -> None:
    answer = await llm(PROMPT)

    assert answer == default_reply(PROMPT, 1)
    [request] = server.requests
    assert request.session == "s1"
    assert request.authorization == f"Bearer {KEY}"
    assert request.body["model"] == "fake-gpt"
    assert request.body["max_tokens"] == 64
    assert request.body["temperature"] == 0.1
    system, user = request.body["messages"]
    assert system["role"] == "system" and "untrusted" in system["content"]
    assert user == {"role": "user", "content": PROMPT}
    assert KEY not in repr(llm)


@pytest.mark.parametrize(
    ("mode", "retryable", "kind", "retry_after"),
    [
        ("429", True, "rate_limited", 1.0),
        ("500", True, "server_error", None),
        ("503", True, "server_error", None),
        ("408", True, "timeout", None),
        ("409", True, "server_error", None),
        ("401", False, "client_error", None),
        ("400", False, "client_error", None),
        ("404", False, "client_error", None),
        ("empty", True, "empty", None),
    ],
)
async def test_errors_are_classified(
    server: FakeOpenAIServer,
    llm: OpenAIChat,
    mode: str,
    retryable: bool,
    kind: str,
    retry_after: float | None,
) -> None:
    server.fail(mode)

    with pytest.raises(LLMError) as caught:
        await llm(PROMPT)

    assert (caught.value.retryable, caught.value.kind) == (retryable, kind)
    assert caught.value.retry_after == retry_after
    assert KEY not in full_text(caught.value)
    assert len(server.requests) == 1  # the client's own retries are off


async def test_client_timeout_is_a_retryable_error(server: FakeOpenAIServer) -> None:
    chat = openai_llm(make_settings(server, llm_timeout_s=0.3))
    server.fail("timeout")
    started = time.monotonic()
    try:
        with pytest.raises(LLMError) as caught:
            await chat(PROMPT)
    finally:
        await chat.aclose()

    assert caught.value.kind == "timeout" and caught.value.retryable
    assert time.monotonic() - started < 2.0
    await wait_for(lambda: server.in_flight == 0, timeout=5, message="held request not dropped")


def test_parse_retry_after() -> None:
    """The LLM client reads Retry-After with the one parser, streams.retry.retry_after."""
    parse_retry_after = retry_after
    now = 1_700_000_000.0
    assert parse_retry_after({"Retry-After": "2"}) == 2.0
    assert parse_retry_after({"retry-after": "0.5"}) == 0.5
    assert parse_retry_after({"retry-after-ms": "250", "Retry-After": "9"}) == 0.25
    assert parse_retry_after({"Retry-After": formatdate(now + 5, usegmt=True)}, now=now) == 5.0
    assert parse_retry_after({"Retry-After": formatdate(now - 5, usegmt=True)}, now=now) == 0.0
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None


def test_missing_api_key_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="AC_LLM_API_KEY"):
        openai_llm(Settings(llm_api_key=None))


# -- retries -------------------------------------------------------------------


async def test_rate_limit_waits_for_retry_after(server: FakeOpenAIServer, llm: OpenAIChat) -> None:
    server.retry_after_s = 1.0
    server.fail("429")
    before = failures("rate_limited")

    answer = await resilient(llm)(PROMPT)

    assert answer == default_reply(PROMPT, 1)
    first, second = server.requests
    assert first.status == 429 and second.status == 200
    assert first.completed is not None
    waited = second.arrived - first.completed
    assert 0.95 <= waited < 2.0, waited
    assert failures("rate_limited") == before + 1


async def test_server_errors_then_success(server: FakeOpenAIServer, llm: OpenAIChat) -> None:
    server.fail("500", "500", "503")
    before = failures("server_error")

    assert await resilient(llm)(PROMPT) == default_reply(PROMPT, 1)

    assert [r.status for r in server.requests] == [500, 500, 503, 200]
    assert failures("server_error") == before + 3


async def test_timeout_then_success(server: FakeOpenAIServer) -> None:
    chat = openai_llm(make_settings(server, llm_timeout_s=0.3))
    server.fail("timeout")
    before = failures("timeout")
    try:
        answer = await resilient(chat)(PROMPT)
    finally:
        await chat.aclose()

    assert answer == default_reply(PROMPT, 1)
    assert [r.mode for r in server.requests] == ["timeout", "ok"]
    assert failures("timeout") == before + 1


async def test_empty_answers_are_failures(server: FakeOpenAIServer, llm: OpenAIChat) -> None:
    server.fail("empty", "empty")
    before = failures("empty")
    guarded = resilient(llm, failure_threshold=2, reset_timeout_s=0.2)

    assert await guarded(PROMPT) == default_reply(PROMPT, 1)

    assert failures("empty") == before + 2
    assert (guarded.breaker.opened_count, guarded.breaker.closed_count) == (1, 1)


async def test_non_retryable_error_raises_at_once(
    server: FakeOpenAIServer, llm: OpenAIChat
) -> None:
    guarded = resilient(llm, failure_threshold=1)
    server.fail("401")
    started = time.monotonic()

    with pytest.raises(LLMError) as caught:
        await guarded(PROMPT)

    assert type(caught.value) is LLMError
    assert not caught.value.retryable and caught.value.status_code == 401
    assert len(server.requests) == 1
    assert time.monotonic() - started < 1.0
    assert not guarded.breaker.is_open  # a bad request is not an outage


async def test_user_callable_exceptions_and_hangs_are_retried() -> None:
    calls = 0

    async def flaky(prompt: str) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        if calls == 2:
            await asyncio.Event().wait()  # hangs forever
        return f"ok: {prompt}"

    before = failures("timeout"), failures("other")

    assert await resilient(flaky, attempt_timeout_s=0.2)("p") == "ok: p"

    assert calls == 3
    assert (failures("timeout"), failures("other")) == (before[0] + 1, before[1] + 1)


async def test_retry_budget_gives_up_with_the_last_cause() -> None:
    async def hangs(prompt: str) -> str:
        await asyncio.Event().wait()
        return ""

    guarded = resilient(hangs, attempt_timeout_s=0.1, retry_budget_s=0.35)
    started = time.monotonic()

    with pytest.raises(LLMUnavailable) as caught:
        await guarded("p")

    elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 1.0, elapsed
    assert isinstance(caught.value.last_cause, LLMError)
    assert caught.value.last_cause.kind == "timeout"
    assert caught.value.retryable and caught.value.attempts >= 2


async def test_each_llm_failure_is_logged_once_and_storms_are_summarised(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old code logged failed LLM calls at INFO, with no session: an outage left
    no WARNING line. Now each failure is a WARNING naming the session, the attempt and
    the reason, but a retry storm is one line per interval saying how many it holds."""

    async def down(prompt: str) -> str:
        raise LLMError("HTTP 500 from the LLM", retryable=True, kind="server_error")

    token = llm_session.set("sess-42")
    try:
        with caplog.at_level(logging.WARNING, logger="agents.summarizer.resilience"):
            with pytest.raises(LLMUnavailable):
                await resilient(down, retry_budget_s=0.3, failure_threshold=1000)("p")
    finally:
        llm_session.reset(token)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    failed = [line for line in lines if "failed (attempt" in line]
    assert failed == [
        "LLM call for session sess-42 failed (attempt 1, server_error): HTTP 500 from the LLM"
    ], lines
    assert any("gave up on session sess-42 after" in line for line in lines), lines

    clock = [100.0]
    monkeypatch.setattr("agents.summarizer.resilience.time.monotonic", lambda: clock[0])
    log = FailureLog(every_s=10)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="agents.summarizer.resilience"):
        for _ in range(50):  # a storm: 50 failures in 5 s
            log.failed(1, LLMError("429", retryable=True, kind="rate_limited"))
            clock[0] += 0.1
        clock[0] += 10
        log.failed(2, LLMError("429", retryable=True, kind="rate_limited"))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[1].endswith("[49 more rate_limited failures in the 10s before this one]")


# -- the circuit breaker -------------------------------------------------------


async def test_breaker_opens_fails_fast_and_closes_after_recovery(
    server: FakeOpenAIServer, llm: OpenAIChat, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="agents.summarizer")
    opened_before = metric("ac_llm_breaker_transitions_total", to="open")
    closed_before = metric("ac_llm_breaker_transitions_total", to="closed")
    guarded = resilient(llm, failure_threshold=3, reset_timeout_s=0.5, retry_budget_s=0.3)
    server.fail_always("500")

    # Three failures open it; the next attempt is refused and the budget ends the call.
    with pytest.raises(LLMUnavailable):
        await guarded(PROMPT)
    assert guarded.breaker.is_open and guarded.breaker.opened_count == 1
    assert len(server.requests) == 3
    assert "LLM circuit breaker opened" in caplog.text
    assert metric("ac_llm_breaker_open") == 1
    assert metric("ac_llm_breaker_transitions_total", to="open") == opened_before + 1

    # While open: no request reaches the server; the call fails fast.
    started = time.monotonic()
    with pytest.raises(LLMUnavailable) as caught:
        await guarded(PROMPT)
    assert time.monotonic() - started < 0.2
    assert isinstance(caught.value.last_cause, LLMError)
    assert caught.value.last_cause.kind == "breaker_open"
    assert len(server.requests) == 3

    # Recovered: a call with budget to spare waits for the half-open time, probes, closes.
    server.recover()
    guarded.retry_budget_s = 5.0
    assert await guarded(PROMPT) == default_reply(PROMPT, 1)
    probe = server.requests[3]
    last_failure = server.requests[2].completed
    assert last_failure is not None and probe.arrived - last_failure >= 0.45
    assert len(server.requests) == 4
    assert not guarded.breaker.is_open and guarded.breaker.closed_count == 1
    assert "LLM circuit breaker closed" in caplog.text
    assert metric("ac_llm_breaker_open") == 0
    assert metric("ac_llm_breaker_transitions_total", to="closed") == closed_before + 1


def test_the_breaker_opens_probes_once_and_ignores_what_says_nothing() -> None:
    now = [0.0]
    breaker = CircuitBreaker(2, 10.0, probe_wait_s=3.0, clock=lambda: now[0])
    assert breaker.admit() is False  # closed: not a probe
    breaker.record(failed=True, probe=False)
    breaker.record(failed=False, probe=False)  # an answer resets the count
    breaker.record(failed=True, probe=False)
    breaker.record(failed=None, probe=False)  # cancelled or cut short: nothing
    assert breaker.state == "closed"
    breaker.record(failed=True, probe=False)
    assert breaker.state == "open" and breaker.opened_count == 1
    with pytest.raises(BreakerOpen) as refused:
        breaker.admit()
    assert refused.value.wait_s == 10.0 and not refused.value.changed.is_set()
    breaker.record(failed=False, probe=False)  # a straggler admitted before it opened
    assert breaker.state == "open"

    now[0] = 10.5
    assert breaker.admit() is True  # the one probe
    assert refused.value.changed.is_set()  # half-open wakes the waiters
    with pytest.raises(BreakerOpen) as refused:
        breaker.admit()
    assert refused.value.wait_s == 3.0  # until the probe's outcome wakes it
    breaker.record(failed=None, probe=True)  # the probe said nothing: another may probe
    assert breaker.admit() is True
    breaker.record(failed=True, probe=True)
    assert breaker.state == "open" and breaker.opened_count == 1  # reopened, not counted

    now[0] = 21.0
    assert breaker.admit() is True
    breaker.record(failed=False, probe=True)
    assert breaker.state == "closed" and breaker.closed_count == 1


async def test_half_open_breaker_lets_one_probe_through(
    server: FakeOpenAIServer, llm: OpenAIChat
) -> None:
    guarded = resilient(llm, failure_threshold=1, reset_timeout_s=0.3, retry_budget_s=0.1)
    server.fail("500")
    with pytest.raises(LLMUnavailable):
        await guarded(PROMPT)
    assert guarded.breaker.is_open

    guarded.retry_budget_s = 10.0
    refused_before = failures("breaker_open")
    server.hold()
    calls = [asyncio.create_task(guarded(f"Session p{i}\n- action {i}")) for i in range(5)]
    try:
        await wait_for(lambda: server.in_flight == 1, timeout=5, message="no probe arrived")
        # Each caller was refused while open, then the four non-probers again while the
        # probe runs: 5 + 4 refusals, and still only the probe reached the server.
        await wait_for(lambda: failures("breaker_open") >= refused_before + 9, timeout=5)
        assert server.in_flight == 1 and len(server.requests) == 2
        released = time.monotonic()
        server.release()
        answers = await asyncio.wait_for(asyncio.gather(*calls), timeout=5)
    finally:
        server.release()
        for call in calls:
            call.cancel()

    assert len(answers) == 5 and all(a.startswith("Summary #1") for a in answers)
    # Waiters are woken by the close, not by their (3 s) fallback timer.
    assert time.monotonic() - released < 1.0
    assert guarded.breaker.closed_count == 1 and not guarded.breaker.is_open


# -- concurrency and secrets ---------------------------------------------------


async def test_concurrency_never_exceeds_the_limit(
    server: FakeOpenAIServer, llm: OpenAIChat
) -> None:
    guarded = resilient(llm, concurrency=3)
    server.hold()
    calls = [asyncio.create_task(guarded(f"Session c{i}\n- action {i}")) for i in range(10)]
    try:
        await wait_for(lambda: server.in_flight == 3, timeout=5, message="3 not in flight")
        assert len(server.requests) == 3  # the others wait for a slot, not at the server
        server.release()
        answers = await asyncio.wait_for(asyncio.gather(*calls), timeout=10)
    finally:
        server.release()
        for call in calls:
            call.cancel()

    assert len(answers) == 10 and len(server.requests) == 10
    assert server.max_in_flight == 3
    assert set(server.max_in_flight_by_session.values()) == {1}
    assert metric("ac_llm_in_flight") == 0


async def test_api_key_never_logged_or_raised(
    server: FakeOpenAIServer, llm: OpenAIChat, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("openai", "httpx", "httpx2", "httpcore", "agents"):
        caplog.set_level(logging.DEBUG, logger=name)
    guarded = resilient(llm, failure_threshold=2, reset_timeout_s=0.1, retry_budget_s=0.5)
    raised: list[BaseException] = []

    server.retry_after_s = 0.05
    server.fail("429", "500")
    await guarded(PROMPT)
    for mode in ("401", "400"):
        server.fail(mode)
        with pytest.raises(LLMError) as caught:
            await guarded(PROMPT)
        raised.append(caught.value)
    server.fail_always("500")
    with pytest.raises(LLMUnavailable) as unavailable:
        await guarded(PROMPT)
    raised.append(unavailable.value)

    assert any(KEY in (r.authorization or "") for r in server.requests)  # it was sent
    assert "Incorrect API key provided: ***" in str(raised[0])
    assert KEY not in caplog.text
    for exc in raised:
        assert KEY not in full_text(exc)


# -- configuration -------------------------------------------------------------


async def echo_llm(prompt: str) -> str:
    return f"echo: {prompt}"


def sync_llm(prompt: str) -> str:
    return prompt


class _AsyncCallable:
    async def __call__(self, prompt: str) -> str:
        return prompt.upper()


callable_object = _AsyncCallable()
NOT_CALLABLE = 42


@pytest.mark.parametrize(
    "dotted",
    [
        "tests.unit.test_llm:echo_llm",
        "tests.unit.test_llm.echo_llm",
        "tests.unit.test_llm:callable_object",
    ],
)
async def test_load_llm_callable(dotted: str) -> None:
    loaded = load_llm_callable(dotted)
    assert (await loaded("hi")) in ("echo: hi", "HI")


@pytest.mark.parametrize(
    ("dotted", "match"),
    [
        ("no_such_module_xyz:fn", "cannot import"),
        ("tests.unit.test_llm:missing", "not found"),
        ("tests.unit.test_llm:NOT_CALLABLE", "must be an async function"),
        ("tests.unit.test_llm:_AsyncCallable", "must be an async function"),
        ("tests.unit.test_llm:sync_llm", "must be async"),
        ("nodots", "must look like"),
    ],
)
def test_load_llm_callable_rejects(dotted: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        load_llm_callable(dotted)


def test_from_settings_maps_fields() -> None:
    settings = Settings(
        llm_concurrency=7,
        breaker_failures=4,
        breaker_reset_s=9.0,
        llm_retry_budget_s=60.0,
        llm_retry_max_wait_s=3.0,
        llm_timeout_s=20.0,
    )
    guarded = ResilientLLM.from_settings(echo_llm, settings)
    assert (guarded.breaker.threshold, guarded.breaker.reset_s) == (4, 9.0)
    assert (guarded.retry_budget_s, guarded.max_wait_s) == (60.0, 3.0)
    assert guarded.attempt_timeout_s > 20.0
    assert guarded.concurrency == 7


class _ClosableLLM:
    def __init__(self) -> None:
        self.closed = 0

    async def __call__(self, prompt: str) -> str:
        return "summary"

    async def aclose(self) -> None:
        self.closed += 1


closable_llm = _ClosableLLM()


async def test_a_summarizer_closes_what_its_llm_holds(server: FakeOpenAIServer) -> None:
    """The summarize stage's owner calls ``aclose()`` at shutdown: the LLM summarizer
    passes it on to its callable (the OpenAI client's HTTP pool); the offline one holds
    nothing."""
    custom = build_summarizer(Settings(llm_callable="tests.unit.test_llm:closable_llm"))
    await custom.aclose()
    assert closable_llm.closed == 1

    chat = openai_llm(make_settings(server))
    await resilient(chat).aclose()
    with pytest.raises(RuntimeError, match="client has been closed"):
        await chat(PROMPT)
    assert server.requests == []

    offline = build_summarizer(Settings())
    assert isinstance(offline, OfflineSummarizer)
    await offline.aclose()


async def test_deadlines_time_out_each_call_at_its_own_deadline_whatever_the_order() -> None:
    """One timer for every attempt (agents/summarizer/deadlines.py): a later call with an
    earlier deadline moves it, a call that returns leaves nothing for it to cancel, and a
    timer left from another event loop does not stand in for this one's."""
    deadlines = Deadlines()
    finished: list[str] = []

    async def forever(entered: asyncio.Event) -> None:
        entered.set()  # the call's deadline is registered: run() awaits this
        await asyncio.Event().wait()

    async def hang(name: str, seconds: float, entered: asyncio.Event | None = None) -> None:
        try:
            await deadlines.run(seconds, forever(entered or asyncio.Event()))
        except TimeoutError:
            finished.append(name)

    async def quick() -> str:
        return await deadlines.run(0.05, asyncio.sleep(0, "answer"))

    async def main() -> list[str]:
        started, entered = time.monotonic(), asyncio.Event()
        slow = asyncio.create_task(hang("slow", 0.6, entered))
        await entered.wait()  # the slow call's deadline is the timer's now
        assert await quick() == "answer"
        await hang("fast", 0.2)  # earlier than the timer: the timer moves to it
        assert time.monotonic() - started < 0.5, "the fast call waited for the slow deadline"
        await slow
        assert 0.55 <= time.monotonic() - started < 1.5
        return finished

    assert await main() == ["fast", "slow"]
    # The same object under another event loop (its timer handle from this one is stale).
    finished.clear()
    assert await asyncio.get_running_loop().run_in_executor(None, asyncio.run, main()) == [
        "fast",
        "slow",
    ]


async def test_deadlines_let_a_cancellation_from_elsewhere_through() -> None:
    """A task cancelled by its owner while in a call is cancelled, not timed out, even when
    its deadline passes at the same time (as under ``asyncio.timeout``)."""
    deadlines = Deadlines()
    entered = asyncio.Event()

    async def call() -> None:
        entered.set()
        await asyncio.Event().wait()

    task = asyncio.create_task(deadlines.run(0.0, call()))
    await entered.wait()
    task.cancel()  # the owner's, with the deadline (0 s) passed: the timer's too
    with pytest.raises(asyncio.CancelledError):
        await task

    hung = asyncio.create_task(deadlines.run(0.01, asyncio.Event().wait()))
    with pytest.raises(TimeoutError):
        await hung
