"""The sink protocol.

A sink is what the SDK calls a destination: ``write_actions(session_id, text)``
and ``overwrite_with_summary(session_id, summary)``. Existing SDK callbacks plug
in unchanged through :class:`CallbackSink`. Sinks that need more (the sequence
range, their own bookkeeping) implement :class:`ContextSink.apply`, which gets
the operation and the session's context *after* it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, runtime_checkable

from schemas import ActionsWritten, SummaryReady
from schemas.text import printable
from sinks.context import SessionContext
from streams.errors import AgentContextError
from streams.hooks import Hook, fire

__all__ = [
    "CallbackSink",
    "ContextSink",
    "ErasingSink",
    "LifecycleSink",
    "LinkAwareSink",
    "PermanentSinkError",
    "erase_at_destination",
    "start_sink",
    "stop_sink",
]

Operation = ActionsWritten | SummaryReady


class PermanentSinkError(AgentContextError):
    """The destination refused this operation for good (e.g. HTTP 400): don't retry it."""


@runtime_checkable
class ContextSink(Protocol):
    name: str

    async def apply(self, op: Operation, context: SessionContext) -> None:
        """Deliver ``op``. Must be idempotent for a redelivery after a crash."""
        ...


@runtime_checkable
class LinkAwareSink(ContextSink, Protocol):
    """A sink whose destination needs a session linked first (an Intercom conversation).

    The runner then also consumes the ``links`` topic, in the same per-session
    lane as the session's operations, and calls :meth:`link` with the context.
    """

    async def link(self, session_id: str, conversation_id: str, context: SessionContext) -> None:
        """Record the link in ``context.extra`` and deliver what waited for it."""
        ...


@runtime_checkable
class LifecycleSink(Protocol):
    """Optional for any sink: ``setup()`` before its first operation (open clients, load
    models), ``aclose()`` after its last one, on a stop. The runner calls both."""

    async def setup(self) -> None: ...

    async def aclose(self) -> None: ...


async def start_sink(sink: object) -> None:
    if callable(setup := getattr(sink, "setup", None)):
        await setup()


@runtime_checkable
class ErasingSink(Protocol):
    """Optional for any sink: remove everything it delivered for a session (an erasure
    request, ``agent-context erase``). Without it the runner only forgets the context."""

    async def erase(self, session_id: str, context: SessionContext) -> None: ...


async def erase_at_destination(sink: object, context: SessionContext) -> None:
    if callable(erase := getattr(sink, "erase", None)):
        await erase(context.session_id, context)


async def stop_sink(sink: object) -> None:
    if callable(aclose := getattr(sink, "aclose", None)):
        await aclose()


async def _call(fn: Callable[..., Any], *args: Any) -> None:
    result = fn(*args)
    if inspect.isawaitable(result):
        await result


class CallbackSink:
    """Adapts the SDK's two callables (sync or async) to :class:`ContextSink`."""

    def __init__(
        self,
        write_actions: Callable[[str, str], Awaitable[None] | None] | None,
        overwrite_with_summary: Callable[[str, str], Awaitable[None] | None],
        *,
        name: str = "callbacks",
        on_connect: Hook | None = None,
        on_disconnect: Hook | None = None,
    ) -> None:
        self.name = name
        self._write_actions = write_actions
        self._overwrite_with_summary = overwrite_with_summary
        self._on_connect, self._on_disconnect = on_connect, on_disconnect

    async def setup(self) -> None:
        await fire(self._on_connect, f"sink {self.name} on_connect")

    async def aclose(self) -> None:
        await fire(self._on_disconnect, f"sink {self.name} on_disconnect", "stopped")

    async def erase(self, session_id: str, context: SessionContext) -> None:
        # The SDK's destinations have no delete: an empty context replaces everything.
        await _call(self._overwrite_with_summary, session_id, "")

    async def apply(self, op: Operation, context: SessionContext) -> None:
        if isinstance(op, ActionsWritten):
            if self._write_actions is not None:
                # The SDK's own text (its ``index`` numbering), as the SDK would write it.
                await _call(self._write_actions, op.session_id, printable(op.payload.to_text()))
        elif op.generation == context.generation:
            # The summary, its range and the session's facts (the ledger), after the
            # earlier visit's when the session came back: everything before the raw tail.
            await _call(self._overwrite_with_summary, op.session_id, context.summary_text())
        else:
            # The previous generation's late final summary: the destination already
            # holds this generation's batches, which the overwrite must keep.
            await _call(self._overwrite_with_summary, op.session_id, context.render().rstrip())
