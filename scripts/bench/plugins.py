"""LLM stand-ins the benchmark's workers load by dotted path (AC_LLM_CALLABLE).

``BENCH_SUMMARY_CHARS`` (``--summary-chars``) makes their summaries as long as a real
model's: the next request's prompt carries it, and the PII filter reads it.
"""

from __future__ import annotations

import asyncio
import os

# Prose without PII, as a model writes from filtered actions.
_PROSE = (
    "The user opened the billing page, changed the plan from Starter to Team, entered a "
    "coupon, tried to update the card on file and saw the error 'card declined' twice, "
    "then opened the help centre article on payment methods and searched for 'invoice'. "
)
_CHARS = int(os.environ.get("BENCH_SUMMARY_CHARS", "0") or 0)


def _summary(prompt: str) -> str:
    head = f"summary of {prompt.count(chr(10))} lines"
    if _CHARS <= len(head):
        return head
    return (f"{head}. " + _PROSE * (_CHARS // len(_PROSE) + 1))[:_CHARS]


async def instant(prompt: str) -> str:
    return _summary(prompt)


async def slow_500ms(prompt: str) -> str:
    await asyncio.sleep(0.5)  # a model's latency, not synchronisation
    return _summary(prompt)
