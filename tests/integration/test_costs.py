"""What summaries cost: tokens and money per product, a daily token budget, the report."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from agents.summarizer import (
    DEFAULT_PROMPT,
    Accounting,
    Completion,
    LLMSummarizer,
    ResilientLLM,
    Usage,
    default_format_actions,
    openai_llm,
    usage_of,
)
from schemas import ActionsPayload
from streams.settings import Settings
from tests.fakes.openai_server import FakeOpenAIServer
from tests.support.cli import cli
from tests.support.cluster import metric, scrape
from tests.support.pipeline import Pipeline, produce
from tests.support.waiting import wait_for
from tests.support.workers import Worker

RECORDER = "tests.support.plugins:RecordingSink"


def test_tokens_are_priced_and_a_product_over_its_budget_waits_for_the_next_day() -> None:
    clock = [1_764_547_200.0]  # 2025-12-01 00:00 UTC
    accounting = Accounting(
        {"m": (1.0, 3.0)},
        daily_token_budget=1_000,
        product_budgets={"p3": 5},
        clock=lambda: clock[0],
    )
    used = accounting.record("p1", Usage("m", prompt_tokens=600, completion_tokens=200))
    assert used is not None and used.cost_usd == pytest.approx((600 * 1.0 + 200 * 3.0) / 1e6)
    assert not accounting.over_budget("p1") and not accounting.over_budget("p2")
    accounting.record("p1", Usage("m", prompt_tokens=150, completion_tokens=50))
    assert accounting.over_budget("p1") and not accounting.over_budget("p2")
    unpriced = accounting.record("p2", Usage("other", 10, 10))
    assert unpriced is not None and unpriced.cost_usd is None
    clock[0] += 86_399.999  # 23:59:59.999 UTC: still the same day
    assert accounting.over_budget("p1")
    clock[0] += 0.001  # 00:00 UTC, the next day: the LLM resumes
    assert not accounting.over_budget("p1")
    assert Accounting({}, daily_token_budget=0).over_budget("p1") is False  # 0: no budget
    accounting.record("p3", Usage("m", 3, 3))
    assert accounting.over_budget("p3")  # its own, smaller budget


async def test_the_openai_clients_usage_survives_retries_and_the_cap() -> None:
    async with FakeOpenAIServer() as server:
        settings = Settings(llm_api_key="sk-test", llm_base_url=server.base_url, llm_model="m")
        chat = openai_llm(settings)
        try:
            server.fail("500")  # a retry in between
            summarizer = LLMSummarizer(
                ResilientLLM.from_settings(chat, settings),
                template=DEFAULT_PROMPT,
                formatter=default_format_actions,
                max_chars=60,
            )
            batch = ActionsPayload.model_validate(
                {"session_id": "s", "actions": [{"description": "Clicked Export"}]}
            )
            summary = await summarizer.summarize(None, [batch])
        finally:
            await chat.aclose()
    usage = usage_of(summary)
    assert isinstance(summary, Completion) and usage is not None
    assert usage.model == "m" and usage.prompt_tokens > 50 and usage.completion_tokens > 0
    assert len(summary) <= 60  # capped, and still carrying its usage


@pytest.mark.kafka
async def test_costs_are_counted_reported_and_budgeted_end_to_end(
    worker_env: dict[str, str], tmp_path: Path, workers: list[Worker]
) -> None:
    """Two products; p-small has a tiny daily budget: after it, its summaries come from
    the offline summarizer, while p-big's keep coming from the LLM. The metrics, the
    operations and `agent-context costs` agree on the tokens."""
    env = {
        **worker_env,
        "AC_THRESHOLD": "5",
        "AC_LLM_API_KEY": "sk-test-not-a-secret",
        "AC_LLM_MODEL": "fake-gpt",
        "AC_FORMAT_ACTIONS": "tests.support.plugins:format_with_session",
        "AC_IDLE_TIMEOUT_S": "3600",
        "AC_LLM_PRICES": '{"fake-gpt": [2.0, 8.0]}',
        "AC_LLM_PRODUCT_BUDGETS": '{"p-small": 250}',
    }

    def batch(sid: str, product: str, n: int) -> dict[str, Any]:
        actions = [{"type": "click", "description": f"Clicked button {i}"} for i in range(n)]
        return {"session_id": sid, "product_id": product, "actions": actions}

    async with FakeOpenAIServer() as llm:
        pipe = Pipeline({**env, "AC_LLM_BASE_URL": llm.base_url}, tmp_path, workers)
        pipeline, _ = pipe.start_pipeline(), pipe.start_sink(RECORDER)
        await asyncio.gather(*(w.wait_ready() for w in pipe.workers))
        # One payload at a time per session: each summary is made before the next.
        for _ in range(6):
            await produce(pipe.env, [batch("small-1", "p-small", 5), batch("big-1", "p-big", 5)])

        def summaries() -> list[dict[str, Any]]:
            return [r for r in pipe.records() if r["op"] == "summary_ready"]

        await wait_for(
            lambda: len(summaries()) == 12, timeout=120, message=lambda: str(len(summaries()))
        )
        by_product: dict[str, list[dict[str, Any]]] = {}
        for r in summaries():
            by_product.setdefault(r["product_id"], []).append(r)
        big, small = by_product["p-big"], by_product["p-small"]
        assert all(r["usage"] is not None for r in big)  # under no budget pressure
        offline = [r for r in small if r["usage"] is None]
        assert offline and small[0]["usage"] is not None  # the LLM first, then offline
        assert all("(Summarised without the LLM:)" in r["summary"] for r in offline)

        text = await scrape(pipeline.url)
        for product, records in by_product.items():
            spent = [r["usage"] for r in records if r["usage"]]
            prompt = sum(u["prompt_tokens"] for u in spent)
            assert metric(text, "ac_llm_tokens_total", product=product, kind="prompt") == prompt
            cost = sum(u["cost_usd"] for u in spent)
            assert metric(text, "ac_llm_cost_usd_total", product=product) == pytest.approx(cost)
        assert metric(text, "ac_summaries_over_budget_total", product="p-small") == len(offline)

        shown = await cli(pipe.env, "costs", "--sessions", "2")
        assert shown.returncode == 0, shown.stderr
        spent_big = [r["usage"] for r in big]
        tokens = sum(u["prompt_tokens"] for u in spent_big)
        line = next(x for x in shown.stdout.splitlines() if x.startswith("p-big"))
        assert line.split()[1:3] == [str(len(big)), str(tokens)], shown.stdout
        assert "big-1 (p-big)" in shown.stdout
