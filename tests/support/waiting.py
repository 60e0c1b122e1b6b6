"""Wait for a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class Timeout(AssertionError):
    pass


async def wait_for(
    condition: Callable[[], T | Awaitable[T]],
    *,
    timeout: float = 30.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "condition not met",
) -> T:
    """Poll ``condition`` until it returns a truthy value; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        if result:
            return result  # type: ignore[return-value]
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise Timeout(f"after {timeout:.0f}s: {text}")
        await asyncio.sleep(interval)


def wait_for_sync(
    condition: Callable[[], T], *, timeout: float = 30.0, interval: float = 0.05, message: str = ""
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() > deadline:
            raise Timeout(f"after {timeout:.0f}s: {message or 'condition not met'}")
        time.sleep(interval)
