"""LLM stand-ins the benchmark's workers load by dotted path (AC_LLM_CALLABLE)."""

from __future__ import annotations

import asyncio


async def instant(prompt: str) -> str:
    return f"summary of {prompt.count(chr(10))} lines"


async def slow_500ms(prompt: str) -> str:
    await asyncio.sleep(0.5)  # a model's latency, not synchronisation
    return f"summary of {prompt.count(chr(10))} lines"
