"""The session view (``AC_SINK=view``, /ui/): its pages, paging and escaping in
process, then a headless Chromium against the real pipeline (Selenium): the list
and a session updating live, a summary replacing batches, deep links and the back
button, hostile action text rendered inert, and the pull view's access control.

``AC_VIEW_SCREENSHOTS=<dir>`` keeps the browser test's screenshots there
(scripts/screenshots.py writes docs/img/ so)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from aiohttp import web

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import ActionsPayload, ActionsWritten, SummaryReady, SummaryUsage
from sinks.context import SessionContext
from sinks.view import SessionRow, ViewSink, list_page_rows
from sinks.view.delivery import SinkDelivery, delivery, delivery_fragment
from sinks.view.operators import operator_strip
from sinks.view.render import list_fragment, session_fragment
from tests.fakes.loopback import LoopbackServer
from tests.integration.test_access import listening_addresses
from tests.support.pipeline import Pipeline, produce
from tests.support.view_server import ViewServer
from tests.support.workers import FAST_REBALANCE, Worker

TOKEN = "view-token-for-tests"
HOSTILE = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'
SID = "s-hostile-42"


def written(sid: str, seq_from: int, descriptions: list[str], **who: str) -> ActionsWritten:
    actions = [
        {"index": i, "type": "click", "title": d, "description": d, "canonical_url": "/x"}
        for i, d in enumerate(descriptions)
    ]
    payload = ActionsPayload.model_validate(
        {"session_id": sid, "product_id": "p", "actions": actions, **who}
    )
    return ActionsWritten(
        session_id=sid, product_id="p", seq_from=seq_from,
        seq_to=seq_from + len(actions) - 1, text=payload.numbered_text(seq_from),
        payload=payload, emitted_at=time.time(),
    )  # fmt: skip


async def test_a_summary_replaces_batches_and_everything_is_escaped() -> None:
    sink, context = ViewSink(), SessionContext(session_id=SID)
    for op in (
        written(SID, 1, ["Opened billing", HOSTILE], user_id="<b>u</b>", email="a@b.example"),
        written(SID, 3, ["Clicked Save", "Mailed <EMAIL_kqzvbt>"]),
    ):
        context = context.advanced(op)
        await sink.apply(op, context)
    summary = SummaryReady(session_id=SID, product_id="p", seq_from=1, seq_to=2, window_from=1,
                           summary=f"The user typed {HOSTILE}", emitted_at=time.time(),
                           usage=SummaryUsage(model="m-1", prompt_tokens=100, completion_tokens=20),
                           summarized_in_s=1.25)  # fmt: skip
    context = context.advanced(summary)
    await sink.apply(summary, context)
    page = session_fragment(sink, context, SID)
    assert "<script>" not in page and "<img" not in page and "<b>u</b>" not in page
    assert "&lt;script&gt;window.pwned=1&lt;/script&gt;" in page
    assert "Summary of actions 1-2" in page and "Raw batch: actions 3-4" in page
    assert "Raw batch: actions 1-2" not in page  # replaced by the summary
    assert "summary of actions 1-2: replaced actions 1-2" in page  # the timeline
    assert "; LLM 1.25 s (m-1, 120 tokens)" in page  # the summarizer's time, from the op
    assert "batch written: actions 3-4; redacted EMAIL ×1" in page
    assert [e["kind"] for e in context.extra["view"]["timeline"]] == ["batch", "batch", "summary"]
    listed = list_fragment(sink, "", "all", 1)
    assert "&lt;b&gt;u&lt;/b&gt;" in listed and "a@b.example" in listed


def test_5000_sessions_are_paged_on_the_server() -> None:
    sink = ViewSink()
    for i in range(5000):
        sink.index(SessionRow(session_id=f"s-{i:04d}", user_id=f"u-{i % 97}",
                              email=f"user{i}@example.com", product_id=f"prod-{i % 3}",
                              closed=i % 4 == 0, actions=i, last_activity=1e9 + i))  # fmt: skip
    started = time.perf_counter()
    html = list_fragment(sink, "", "all", 1)
    assert time.perf_counter() - started < 1.0  # generous: ~10 ms here
    assert html.count("<tr data-session=") == 50 and "5000 sessions, page 1 of 100" in html
    assert html.index("s-4999") < html.index("s-4998")  # most recently active first
    rows, matching, pages = list_page_rows(list(sink.rows.values()), "USER40", "closed", 1, 50)
    assert matching == len(rows) == 29 and pages == 1  # 40, 400-409, 4000-4099, closed: 1 in 4
    assert all(r.closed and "user40" in r.email for r in rows)
    last = list_page_rows(list(sink.rows.values()), "", "all", 999, 50)
    assert last[2] == 100 and last[0][-1].session_id == "s-0000"  # clamped to the last page


# ---------------------------------------------------------------------- the browser


def chrome(download_dir: Path) -> Any:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.options import Options
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip("selenium is not installed: pip install -e '.[test]'")
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip(
            "no headless browser: scripts/bootstrap.sh installs Debian's chromium and "
            "chromium-driver with apt-get where it can (apt-get install chromium chromium-driver)"
        )
    options = Options()
    options.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                "--window-size=1360,900", "--disable-gpu"):  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(options=options, service=Service(driver))


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Any]:
    driver = chrome(tmp_path)
    try:
        yield driver
    finally:
        driver.quit()


def payload(sid: str, first: int, descriptions: list[str], **extra: str) -> dict[str, Any]:
    actions = [
        {"index": first + i, "type": "click", "title": d, "description": d,
         "canonical_url": "https://app.example.com/billing"}
        for i, d in enumerate(descriptions)
    ]  # fmt: skip
    return {"session_id": sid, "product_id": "acme", "actions": actions, **extra}


def shoot(browser: Any, tmp_path: Path, name: str) -> None:
    browser.save_screenshot(str(tmp_path / name))
    if target := os.environ.get("AC_VIEW_SCREENSHOTS"):
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(tmp_path / name, Path(target) / name)


@pytest.mark.kafka
async def test_browser_watches_a_session_live(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker], browser: Any
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    env = {**worker_env, **FAST_REBALANCE, "AC_THRESHOLD": "4", "AC_IDLE_TIMEOUT_S": "3600",
           "AC_API_TOKEN": TOKEN}  # fmt: skip
    pipe = Pipeline(env, tmp_path, workers)
    files = pipe.start_sink("files")  # another sink, whose delivery the session page shows
    started = [pipe.start_pipeline(), pipe.start_sink("view", AC_VIEW_METRICS_URLS=files.url)]
    await asyncio.gather(*(w.wait_ready() for w in [*started, files]))
    view = started[1].url
    assert listening_addresses(started[1].web_port) == {"127.0.0.1"}  # AC_WEB_HOST's default
    from selenium.common.exceptions import StaleElementReferenceException

    # A live update replaces the elements it holds: a stale one is looked up again.
    wait = WebDriverWait(browser, 60, 0.1, ignored_exceptions=[StaleElementReferenceException])

    def text(css: str) -> str:  # in one script: a live update replaces elements
        script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)"
        return "\n".join(browser.execute_script(script, css))

    # The token once: an HttpOnly cookie, and the URL without it.
    browser.get(f"{view}/ui/?token={TOKEN}")
    assert browser.current_url == f"{view}/ui/"
    cookie = browser.get_cookie("ac_view")
    assert cookie is not None and cookie["httpOnly"] and TOKEN not in cookie["value"]
    wait.until(ec.text_to_be_present_in_element((By.ID, "live-status"), "live"))
    browser.execute_script("window.marker = 'no reload'")

    # The list fills live as sessions arrive.
    background = list(interleaved_payloads(plan_sessions(24, mean_length=9, seed=5), seed=5))
    await produce(env, background)
    hostile_user = {"user_id": "<b>u-7</b>", "email": "jo@example.com"}
    await produce(
        env, [payload(SID, 0, ["Opened billing", HOSTILE, "Saw invoice"], **hostile_user)]
    )
    wanted = len({p["session_id"] for p in background}) + 1
    wait.until(lambda b: f"{wanted} sessions" in text("#count"))
    assert browser.execute_script("return window.marker") == "no reload"
    assert "<b>u-7</b>" in text(f'tr[data-session="{SID}"]')  # as text, not bold
    shoot(browser, tmp_path, "view-list.png")

    # Search by user, then follow the session's link (the back button returns).
    browser.find_element(By.NAME, "q").send_keys("u-7")
    browser.find_element(By.CSS_SELECTOR, "form button").click()
    wait.until(lambda b: "1 session," in text("#count"))
    search_url = browser.current_url
    assert "q=u-7" in search_url
    wait.until(lambda b: b.find_element(By.LINK_TEXT, SID).click() or True)
    wait.until(ec.url_contains(f"/ui/sessions/{SID}"))
    wait.until(ec.text_to_be_present_in_element((By.ID, "live-status"), "live"))
    assert "Raw batch: actions 1-3" in text("#context")
    browser.execute_script("window.marker = 'session page'")

    # Two more actions cross the threshold: a summary replaces the batch, live.
    await produce(env, [payload(SID, 3, ["Clicked Pay", "Submitted card"], **hostile_user)])
    wait.until(lambda b: "Summary of actions 1-5" in text("#summary-range"))
    await produce(env, [payload(SID, 5, [f"Typed {HOSTILE} into search"], **hostile_user)])
    wait.until(lambda b: "Raw batch: action 6" in text("#context"))
    assert "Raw batch: actions 1-3" not in text("#context")
    timeline = text("#timeline")
    assert "summary of actions 1-5: replaced actions 1-5" in timeline
    assert "batch written: actions 4-5" in timeline and "batch written: action 6" in timeline
    assert re.search(
        r"replaced actions 1-5 and the summary before them; (LLM|summarised)", timeline
    )
    # The files sink's delivery of this session, from its pull view and metrics.
    wait.until(
        lambda b: "files" in text("#delivery") and "up to date" in text("#delivery tr[data-worker]")
    )
    assert browser.execute_script("return window.marker") == "session page"  # no reload
    # Hostile text is text: shown literally, never run or parsed.
    assert HOSTILE in text("#context")
    assert browser.execute_script("return window.pwned") is None
    assert not browser.find_elements(By.CSS_SELECTOR, "#live script, #live img, #context b")
    shoot(browser, tmp_path, "view-session.png")

    browser.back()
    wait.until(lambda b: b.current_url == search_url and "1 session," in text("#count"))
    browser.forward()
    wait.until(lambda b: "Raw batch: action 6" in text("#context"))

    # A deep link in a browser without the cookie: refused, then the token once.
    deep = f"{view}/ui/sessions/{SID}"
    browser.delete_all_cookies()
    browser.get(deep)
    assert "Unauthorized" in browser.find_element(By.TAG_NAME, "body").text
    assert "Opened billing" not in browser.page_source
    browser.get(f"{deep}?token={TOKEN}")
    assert browser.current_url == deep
    wait.until(lambda b: "Summary of actions 1-5" in text("#summary-range"))

    # Every endpoint with session data: 401 without the token, as the pull view.
    paths = ["/ui/", "/ui/events", f"/ui/sessions/{SID}", f"/ui/sessions/{SID}/events",
             "/ui/?token=wrong", f"/sessions/{SID}/context"]  # fmt: skip
    async with httpx.AsyncClient(base_url=view, timeout=30) as anyone:
        for path in paths:
            refused = await anyone.get(path)
            assert refused.status_code == 401 and "Opened billing" not in refused.text, path
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=view, timeout=30, headers=auth) as http:
        assert SID in (await http.get("/ui/", params={"q": "acme"})).text
        async with http.stream("GET", f"/ui/sessions/{SID}/events") as events:
            assert events.headers["content-type"].startswith("text/event-stream")
            first = await anext(events.aiter_text())
            assert first.startswith("event: update\n") and "Summary of actions 1-5" in first

    # A restarted view worker lists the sessions again, from its table.
    started[1].stop()
    restarted = await pipe.start_sink("view").wait_ready()
    async with httpx.AsyncClient(base_url=restarted.url, timeout=30, headers=auth) as http:
        listed = (await http.get("/ui/", params={"q": SID})).text
        assert "1 session," in listed and f'data-session="{SID}"' in listed
        page = (await http.get(f"/ui/sessions/{SID}")).text
        assert "Summary of actions 1-5" in page and "batch written: action 6" in page


class _MetricsServer(LoopbackServer):
    """A worker's /metrics, as the pipeline would answer it."""

    text = (
        "# HELP ac_consumer_lag lag\n# TYPE ac_consumer_lag gauge\n"
        'ac_consumer_lag{group="app",topic="t.actions",partition="0"} 7.0\n'
        'ac_consumer_lag{group="app",topic="t.summarize",partition="0"} 3.0\n'
        "# HELP ac_llm_breaker_open open\n# TYPE ac_llm_breaker_open gauge\n"
        "ac_llm_breaker_open 1.0\n"
        "# HELP ac_llm_latency_seconds lat\n# TYPE ac_llm_latency_seconds histogram\n"
        'ac_llm_latency_seconds_bucket{le="+Inf"} 4.0\n'
        "ac_llm_latency_seconds_count 4.0\nac_llm_latency_seconds_sum 2.0\n"
        "# HELP ac_dead_letters_total dl\n# TYPE ac_dead_letters_total counter\n"
        'ac_dead_letters_total{stage="accumulate",reason="<b>not JSON</b>"} 2.0\n'
    )

    def routes(self, app: web.Application) -> None:
        async def metrics(request: web.Request) -> web.Response:
            return web.Response(text=self.text)

        app.router.add_get("/metrics", metrics)


async def test_the_operator_strip_reads_the_workers_metrics() -> None:
    """Lag per consumer group, the breaker, LLM latency and dead letters by reason, from
    the workers named in AC_VIEW_METRICS_URLS; one that does not answer is named."""
    async with _MetricsServer() as pipeline:
        down = "http://127.0.0.1:9"
        # own="": this test process's registry holds other tests' samples.
        strip = await operator_strip([pipeline.origin, down], token=None, own="")
    assert "<strong>Lag</strong> app 10" in strip
    assert "<strong>LLM breaker</strong> open" in strip
    assert "<strong>LLM</strong> 4 calls, mean 500 ms" in strip
    assert "accumulate: &lt;b&gt;not JSON&lt;/b&gt; 2" in strip  # escaped: labels are data
    assert f"<strong>Not answering</strong> {down}" in strip


# ---------------------------------------------------------------------- at scale


LONG = "s-long"


def long_session_ops(actions: int = 10_000, batch: int = 50, every: int = 500) -> Iterator[Any]:
    """A 10,000-action session as the pipeline would send it: batches of 50, a rolling
    summary every 500 actions, the raw batches after the last summary (9501-10000)."""
    for first in range(1, actions + 1, batch):
        yield written(LONG, first, [f"Step {first + i} on /reports" for i in range(batch)],
                      user_id="u-long", email="long@example.com")  # fmt: skip
        last = first + batch - 1
        if last % every == 0 and last < actions:
            yield SummaryReady(session_id=LONG, product_id="p", seq_from=1, seq_to=last,
                               window_from=last - every + 1, summary=f"Went through {last} steps",
                               emitted_at=time.time(), summarized_in_s=0.8)  # fmt: skip


def test_every_endpoint_with_session_data_needs_the_token() -> None:
    """Every route the view registers, found by asking it: without the token each one
    that returns session data answers 401 and none of it; only the redirect and the
    script (no session data) are open."""
    with ViewServer(ViewSink(), TOKEN) as view:
        view.call(view.apply(written(SID, 1, ["Opened billing"], email="jo@example.com")))
        opened = set()
        with httpx.Client(base_url=view.url, timeout=10, follow_redirects=False) as http:
            for route in view.paths:
                path = route.replace("{session_id}", SID)
                for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "ac_view=x"}):
                    answer = http.get(path, headers=headers)
                    assert "Opened billing" not in answer.text and "jo@example" not in answer.text
                    if answer.status_code != 401:
                        opened.add(route)
                if route not in ("/ui", "/ui/app.js"):  # a wrong ?token= is no login
                    assert http.get(path, params={"token": "wrong"}).status_code == 401, route
            good = {"Authorization": f"Bearer {TOKEN}"}
            assert "Opened billing" in http.get(f"/ui/sessions/{SID}", headers=good).text
        assert opened == {"/ui", "/ui/app.js"}, opened
        assert len(view.paths) == 6  # a new route is added to this test's reckoning


async def test_delivery_compares_each_sink_with_the_view() -> None:
    """Each other sink's pull view against the view's context: up to date, behind by
    how many actions, not answering; retries and refusals from its metrics."""

    class SinkWorker(LoopbackServer):
        def routes(self, app: web.Application) -> None:
            async def metrics(request: web.Request) -> web.Response:
                return web.Response(text=(
                    "# TYPE ac_sink_retries_total counter\n"
                    'ac_sink_retries_total{sink="webhook"} 3.0\n'
                    "# TYPE ac_sink_operations_total counter\n"
                    'ac_sink_operations_total{sink="webhook",op="summary_ready",'
                    'outcome="refused"} 1.0\n'
                ))  # fmt: skip

            async def pulled(request: web.Request) -> web.Response:
                return web.json_response(
                    {"generation": 0, "actions_applied": 2, "summaries": 0, "closed": False}
                )

            app.router.add_get("/metrics", metrics)
            app.router.add_get("/sessions/{sid}/context", pulled)

    context = SessionContext(session_id=SID)
    for op in (written(SID, 1, ["a", "b"]), written(SID, 3, ["c", "d", "e"])):
        context = context.advanced(op)
    async with SinkWorker() as other:
        found = await delivery([other.origin, "http://127.0.0.1:9"], None, SID)
    html = delivery_fragment(found, context)
    assert f"webhook ({other.origin})</td><td>behind: 3 actions pending" in html
    assert "<td>3</td><td>1</td></tr>" in html  # retries, refused
    assert "http://127.0.0.1:9)</td><td>not answering" in html
    caught_up = SinkDelivery("u", ["files"], answered=True, session={
        "generation": 0, "actions_applied": 5, "summaries": 0})  # fmt: skip
    assert "<td>up to date</td>" in delivery_fragment([caught_up], context)


def test_browser_pages_through_5000_sessions_and_a_10000_action_session(browser: Any) -> None:
    """The view holds 5,000 sessions and one of 10,000 actions (fed through its sink
    API, ViewServer): the browser gets one page of each, the paging and the search
    work, and the long session's page is a summary, a raw tail and 50 operations."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(browser, 30, 0.05)

    def text(css: str) -> str:
        script = "return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)"
        return "\n".join(browser.execute_script(script, css))

    def count(css: str) -> int:
        return int(
            browser.execute_script("return document.querySelectorAll(arguments[0]).length", css)
        )

    with ViewServer(ViewSink(), TOKEN) as view:

        async def feed() -> None:
            for i in range(5000):
                who = {"user_id": f"u-{i % 97}", "email": f"user{i}@example.com"}
                await view.apply(written(f"s-{i:04d}", 1, [f"Action of session {i}"], **who))
            for op in long_session_ops():
                await view.apply(op)

        view.call(feed())
        browser.get(f"{view.url}/ui/?token={TOKEN}")
        wait.until(lambda b: "5001 sessions, page 1 of 101" in text("#count"))
        assert count("#sessions tr") == 50
        assert text("#sessions tr:first-child td:first-child") == LONG  # most recent first
        browser.find_element(By.CSS_SELECTOR, "#live a[rel=next]").click()
        wait.until(lambda b: "page 2 of 101" in text("#count"))
        assert "page=2" in browser.current_url and count("#sessions tr") == 50
        assert LONG not in text("#sessions")
        browser.find_element(By.NAME, "q").send_keys("user4321@")
        browser.find_element(By.CSS_SELECTOR, "form button").click()
        wait.until(lambda b: "1 session, page 1 of 1" in text("#count"))
        assert text("#sessions td:nth-child(3)") == "user4321@example.com"

        browser.get(f"{view.url}/ui/sessions/{LONG}")
        wait.until(lambda b: "Summary of actions 1-9500" in text("#summary-range"))
        assert count("#context .batch") == 10  # the raw tail: 9501-10000
        assert "Raw batch: actions 9951-10000" in text("#context")
        assert count("#timeline tr") == 50
        assert "200 operations kept, page 1 of 4" in text("#timeline-count")
        assert "batch written: actions 9951-10000" in text("#timeline tr:first-child")
        assert browser.execute_script("return document.getElementsByTagName('*').length") < 2000
        browser.find_element(By.CSS_SELECTOR, "#live a[rel=next]").click()
        wait.until(lambda b: "page 2 of 4" in text("#timeline-count"))
        assert "ops=2" in browser.current_url and count("#timeline tr") == 50
        browser.back()
        wait.until(
            lambda b: "page 1 of 4" in text("#timeline-count") and "live" in text("#live-status")
        )

        # Live on the long session's page: a new batch arrives without a reload.
        view.call(view.apply(written(LONG, 10_001, ["Opened the export"])))
        wait.until(lambda b: "Raw batch: action 10001" in text("#context"))
        assert "batch written: action 10001" in text("#timeline tr:first-child")
