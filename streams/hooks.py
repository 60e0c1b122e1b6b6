"""User callables named by dotted path, and lifecycle hooks that never break a worker.

The SDK's callables (``embed``, ``upsert``, ``on_connect``, ``on_disconnect``, ...)
may be sync or async and take fewer arguments than we can offer (the SDK's
``on_disconnect`` takes none, ours gets the reason): :func:`call` adapts both.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

from streams.errors import ConfigurationError
from streams.plugins import resolve

__all__ = ["Hook", "call", "fire", "load_callable"]

log = logging.getLogger(__name__)

Hook = Callable[..., Any]


def load_callable(dotted: str | None, setting: str) -> Hook | None:
    if not dotted:
        return None
    target = resolve(dotted, setting)
    if not callable(target):
        raise ConfigurationError(f"{setting}={dotted!r} is not callable")
    return target  # type: ignore[no-any-return]


def _accepted(fn: Hook, args: tuple[Any, ...]) -> tuple[Any, ...]:
    # The SDK's hooks take no arguments; ours may take the reason: pass what fits.
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return args
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return args
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return args[: len(positional)]


async def call(fn: Hook, *args: Any) -> Any:
    """Call ``fn`` with the arguments it accepts; await the result if it is awaitable."""
    result = fn(*_accepted(fn, args))
    if inspect.isawaitable(result):
        result = await result
    return result


async def fire(fn: Hook | None, name: str, *args: Any) -> None:
    """Run a lifecycle hook; a hook that raises is logged and never stops the caller
    (as in the SDK's client: a reconnect must not depend on user code)."""
    if fn is None:
        return
    try:
        await call(fn, *args)
    except Exception:
        log.exception("%s hook raised", name)
