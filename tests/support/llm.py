"""LLM callables that test workers load by dotted path (``AC_LLM_CALLABLE=...``)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

__all__ = ["gated_llm"]


async def gated_llm(prompt: str) -> str:
    """Answers at once, except for prompts containing ``AC_GATE_MATCH``: those wait
    while the file ``AC_GATE_FILE`` exists (a summary stuck in a slow LLM call)."""
    gate, match = os.environ.get("AC_GATE_FILE"), os.environ.get("AC_GATE_MATCH")
    if gate and match and match in prompt:
        while Path(gate).exists():  # noqa: ASYNC110, ASYNC240 (a file is the cross-process signal)
            await asyncio.sleep(0.1)
    lines = [line for line in prompt.splitlines() if line[:1].isdigit()]
    return f"Summary of {len(lines)} actions ({hashlib.sha256(prompt.encode()).hexdigest()[:8]})"
