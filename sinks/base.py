"""The sink contract: what a destination implements, and when the runner calls it.

To add a sink, subclass :class:`Sink`, set ``name``, implement ``apply``, and
name it in ``AC_SINK`` (a built-in name, an entry point or a dotted path:
``sinks/registry.py``). ``sinks/files.py`` is a short example; ``sinks/webhook.py``
one over HTTP, with ``sinks/_http.py`` for retries and rate limits. The SDK's two
callables (``write_actions``, ``overwrite_with_summary``) plug in unchanged
through :class:`CallbackSink`.

The lifecycle, in one sink worker (``sinks/runner/``):

1. ``from_settings(settings)`` builds the sink once; read the sink's own settings
   here (``AC_<NAME>_*``), so that bad ones stop the worker at start.
2. ``await setup()``, once, before the first operation: open clients, load
   models. Raising stops the worker.
3. ``await apply(op, context)`` for every operation, one at a time per session
   in sequence order, sessions concurrently. ``context`` is the session's context
   *after* ``op``; ``context.extra`` is the sink's own JSON bookkeeping, saved
   once ``apply`` returns. Any exception is retried with backoff while the
   session waits; :class:`PermanentSinkError` dead-letters the operation instead.
   After a crash an operation may come again: ``apply`` must be idempotent.
   A sink whose ``apply`` is local and quick sets ``inline = True`` (null, stdout, view):
   each fetched batch is then applied in order in one task and committed once.
   A sink that never reads an ``ActionsWritten``'s ``payload`` sets
   ``reads_payload = False`` (null, stdout, files, intercom): it is then None, neither
   parsed nor checked. A sink that delivers nothing sets ``delivers = False`` (null:
   agents read the pull view): ``apply`` is never called, the runner only keeps the
   contexts, and a batch right after the session's last costs neither model nor context.
4. ``await link(session_id, conversation_id, context)``, only for a
   :class:`LinkAwareSink`, in the same per-session order as the operations.
5. ``await erase(session_id, context)`` on an erasure request: remove what the
   sink delivered for the session (the default removes nothing).
6. ``await aclose()``, once, on a stop, after the last operation: close clients.

A plug-in that does not subclass :class:`Sink` may leave out any step but
``apply``: the runner calls only what is there.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, Self, runtime_checkable

from schemas import ActionsWritten, SummaryReady
from schemas.text import printable
from sinks.context import SessionContext
from streams.errors import AgentContextError
from streams.hooks import Hook, fire
from streams.settings import Settings

__all__ = [
    "CallbackSink",
    "ContextSink",
    "LinkAwareSink",
    "Operation",
    "PermanentSinkError",
    "Sink",
    "erase_at_destination",
    "start_sink",
    "stop_sink",
]

Operation = ActionsWritten | SummaryReady


class PermanentSinkError(AgentContextError):
    """The destination refused this operation for good (e.g. HTTP 400): don't retry it."""


@runtime_checkable
class ContextSink(Protocol):
    """What the runner needs of any sink, subclass of :class:`Sink` or not."""

    name: str

    async def apply(self, op: Operation, context: SessionContext) -> None:
        """Deliver ``op``. Must be idempotent for a redelivery after a crash."""
        ...


class Sink(ABC):
    """The base of a sink: steps 1-6 of this module's docstring, all but ``apply``
    with a default."""

    name: str
    # True for a sink whose ``apply`` is local and quick (no network, no thread): the
    # runner then applies each fetched batch in order in one task and commits it once,
    # instead of a task and a commit per operation; a retry then holds every session.
    inline: bool = False
    # False for a sink that never reads ``ActionsWritten.payload`` (its header and
    # ``text`` suffice): left None, unparsed, two thirds of decoding's cost (test_fast_decode.py).
    reads_payload: bool = True
    # False for a sink that delivers nothing (null: agents read the pull view): the runner
    # keeps its contexts without calling ``apply`` (ContextStore.append; implies ``inline``).
    delivers: bool = True

    @classmethod
    def from_settings(cls, settings: Settings) -> Self:
        return cls()

    async def setup(self) -> None:
        return None

    @abstractmethod
    async def apply(self, op: Operation, context: SessionContext) -> None:
        """Deliver ``op``. Must be idempotent for a redelivery after a crash."""

    async def erase(self, session_id: str, context: SessionContext) -> None:
        return None

    async def aclose(self) -> None:
        return None


@runtime_checkable
class LinkAwareSink(ContextSink, Protocol):
    """A sink whose destination needs a session linked first (an Intercom conversation).

    The runner then also consumes the ``links`` topic, in the same per-session
    lane as the session's operations, and calls :meth:`link` with the context.
    """

    async def link(self, session_id: str, conversation_id: str, context: SessionContext) -> None:
        """Record the link in ``context.extra`` and deliver what waited for it."""
        ...


async def start_sink(sink: object) -> None:
    """Step 2, for any sink."""
    if callable(setup := getattr(sink, "setup", None)):
        await setup()


async def erase_at_destination(sink: object, context: SessionContext) -> None:
    """Step 5, for any sink."""
    if callable(erase := getattr(sink, "erase", None)):
        await erase(context.session_id, context)


async def stop_sink(sink: object) -> None:
    """Step 6, for any sink."""
    if callable(aclose := getattr(sink, "aclose", None)):
        await aclose()


async def _call(fn: Callable[..., Any], *args: Any) -> None:
    result = fn(*args)
    if inspect.isawaitable(result):
        await result


class CallbackSink(Sink):
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
