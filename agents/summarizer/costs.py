"""What summaries cost: tokens and money per product and model, and a daily token budget.

Tokens come from each LLM answer's reported usage (:class:`agents.summarizer.llm.Usage`);
money from ``AC_LLM_PRICES`` (USD per million prompt and completion tokens, per model).
Past ``AC_LLM_DAILY_TOKEN_BUDGET`` tokens in a UTC day for one product (or its own
figure in ``AC_LLM_PRODUCT_BUDGETS``), that product's summaries come from the offline
summarizer until the day ends: nothing is dropped, and the LLM resumes the next day.
The budget is counted by each pipeline worker for the sessions it owns (a restart
starts the day's count again): with N workers, a product may spend up to N times the
budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from agents.summarizer.llm import Usage
from schemas import SummaryUsage
from streams.observe import metrics

__all__ = ["Accounting", "CostReport"]

log = logging.getLogger(__name__)


class Accounting:
    def __init__(
        self,
        prices: dict[str, tuple[float, float]],
        daily_token_budget: int,
        product_budgets: dict[str, int] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.prices, self.budget, self._clock = prices, daily_token_budget, clock
        self.product_budgets = product_budgets or {}
        self._day, self._day_number = "", -1
        self._spent: dict[str, int] = {}  # product -> tokens today (UTC)
        self._announced: set[str] = set()  # products told "over budget" today

    def _today(self) -> str:
        now = self._clock()
        # UTC days are whole multiples of 86,400 s of the epoch: a division per request,
        # the date formatted once a day (test_costs.py: the count starts again at 00:00).
        if int(now // 86400) != self._day_number:  # a new UTC day: every count starts again
            self._day_number = int(now // 86400)
            self._day = time.strftime("%Y-%m-%d", time.gmtime(now))
            self._spent, self._announced = {}, set()
        return self._day

    def over_budget(self, product: str) -> bool:
        """Whether ``product`` spent its tokens for today (then summarise offline)."""
        day = self._today()
        budget = self.product_budgets.get(product, self.budget)
        if not budget or self._spent.get(product, 0) < budget:
            return False
        metrics.SUMMARIES_OVER_BUDGET.labels(product or "-").inc()
        if product not in self._announced:
            self._announced.add(product)
            log.warning(
                "product %s spent its %d LLM tokens for %s (UTC): its summaries come from "
                "the offline summarizer until the day ends",
                product or "-",
                budget,
                day,
            )
        return True

    def record(self, product: str, usage: Usage | None) -> SummaryUsage | None:
        """Count one answer's tokens (and money) for ``product``; what a summary reports."""
        if usage is None:
            return None
        self._today()
        tokens = usage.prompt_tokens + usage.completion_tokens
        self._spent[product] = self._spent.get(product, 0) + tokens
        label = product or "-"
        metrics.LLM_TOKENS.labels(label, usage.model, "prompt").inc(usage.prompt_tokens)
        metrics.LLM_TOKENS.labels(label, usage.model, "completion").inc(usage.completion_tokens)
        cost = None
        if (price := self.prices.get(usage.model)) is not None:
            cost = (usage.prompt_tokens * price[0] + usage.completion_tokens * price[1]) / 1e6
            metrics.LLM_COST.labels(label, usage.model).inc(cost)
        return SummaryUsage(
            model=usage.model,
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cost_usd=cost,
        )


class CostReport:
    """Tokens and money per product and per session, from ``summary_ready`` operations."""

    def __init__(self) -> None:
        # (summaries, prompt tokens, completion tokens, cost; None while no price is known)
        self.products: dict[str, list[float]] = {}
        self.sessions: dict[tuple[str, str], list[float]] = {}
        self.unpriced = 0  # summaries whose model had no price

    def add(self, product: str, session: str, usage: SummaryUsage) -> None:
        for key, table in ((product, self.products), ((product, session), self.sessions)):
            row = table.setdefault(key, [0, 0, 0, 0.0])  # type: ignore[arg-type]
            row[0] += 1
            row[1] += usage.prompt_tokens
            row[2] += usage.completion_tokens
            row[3] += usage.cost_usd or 0.0
        self.unpriced += usage.cost_usd is None

    def lines(self, top_sessions: int) -> list[str]:
        out = ["product            summaries  prompt tokens  completion tokens   cost (USD)"]
        for product, (n, prompt, completion, cost) in sorted(self.products.items()):
            out.append(
                f"{product or '-':<18} {int(n):>9}  {int(prompt):>13}  {int(completion):>17}"
                f"  {cost:>11.6f}"
            )
        ranked = sorted(self.sessions.items(), key=lambda kv: (-kv[1][3], -kv[1][1]))
        if ranked and top_sessions:
            out.append(f"the {min(top_sessions, len(ranked))} costliest sessions:")
            for (product, session), (n, prompt, completion, cost) in ranked[:top_sessions]:
                out.append(
                    f"  {session} ({product or '-'}): {int(n)} summaries, "
                    f"{int(prompt + completion)} tokens, {cost:.6f} USD"
                )
        if self.unpriced:
            out.append(f"{self.unpriced} summaries used a model with no price in AC_LLM_PRICES")
        return out
