"""The session view's routes (sinks/view/routes.py) served by aiohttp on a thread of
this process and fed through the sink's own API, for tests that need a view holding
more than the pipeline could feed in a test's time (10,000 actions, 5,000 sessions).

Faust's web layer is replaced by the three calls the routes make (``page``, and a
``View``'s ``html``/``text``/``json``); a thread, because Selenium's calls block.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from types import SimpleNamespace, TracebackType
from typing import Any, Self, TypeVar

from aiohttp import web
from pydantic import SecretStr

from schemas import ActionsWritten, SummaryReady
from sinks.context import SessionContext
from sinks.view import ViewSink

__all__ = ["ViewServer"]

T = TypeVar("T")


class _View:
    """What a Faust ``View`` gives the routes."""

    def html(self, body: str, status: int = 200, headers: dict[str, str] | None = None) -> Any:
        return web.Response(text=body, status=status, headers=headers, content_type="text/html")

    def text(self, body: str, content_type: str = "text/plain", status: int = 200) -> Any:
        return web.Response(text=body, status=status, content_type=content_type)

    def json(self, value: Any, status: int = 200, headers: dict[str, str] | None = None) -> Any:
        return web.json_response(value, status=status, headers=headers)


class ViewServer:
    """``with ViewServer(ViewSink(), token) as view``: ``view.url``, ``view.paths``
    (every route the view registered), ``view.call(view.apply(op))`` from any thread."""

    def __init__(self, sink: ViewSink, token: str | None = None) -> None:
        self.sink = sink
        self.contexts: dict[str, SessionContext] = {}
        self.settings = SimpleNamespace(api_token=SecretStr(token) if token else None)
        self.consumer_generation_id = 1
        self.paths: list[str] = []
        self._app = web.Application()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._runner: web.AppRunner | None = None
        from sinks.view.routes import add_routes

        add_routes(self, self.contexts, self.contexts.__getitem__, sink)

    def page(self, path: str) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        def register(handler: Callable[..., Awaitable[Any]]) -> Any:
            async def serve(request: web.Request) -> Any:
                return await handler(_View(), request, **request.match_info)

            self._app.router.add_get(path, serve)
            self.paths.append(path)
            return handler

        return register

    def call(self, coroutine: Awaitable[T]) -> T:
        """Run ``coroutine`` on the server's loop (the sink's events belong to it)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()  # type: ignore[arg-type]

    async def apply(self, op: ActionsWritten | SummaryReady) -> None:
        """What the sink runner does with an operation: advance the context, apply it."""
        before = self.contexts.get(op.session_id) or SessionContext(session_id=op.session_id)
        context = before.advanced(op)
        await self.sink.apply(op, context)
        self.contexts[op.session_id] = context

    async def _start(self) -> None:
        # Open event streams end only when cancelled: no grace period to wait out.
        self._runner = web.AppRunner(
            self._app, handler_cancellation=True, access_log=None, shutdown_timeout=0.5
        )
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    def __enter__(self) -> Self:
        self._thread.start()
        self.call(self._start())
        assert self._runner is not None
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
