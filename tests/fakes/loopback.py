"""The lifecycle every loopback fake shares: an aiohttp server on 127.0.0.1, a free port."""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from aiohttp import web

__all__ = ["LoopbackServer"]


class LoopbackServer:
    """Subclasses add their routes in ``routes``; ``origin`` is ``http://127.0.0.1:<port>``."""

    def __init__(self) -> None:
        self._closing = asyncio.Event()  # set on stop: handlers holding a request let go
        self._runner: web.AppRunner | None = None
        self._port: int | None = None

    def routes(self, app: web.Application) -> None:
        raise NotImplementedError

    async def start(self) -> Self:
        app = web.Application()
        self.routes(app)
        # Cancel handlers whose client went away (e.g. after a client timeout),
        # so what a fake counts as in flight is what is really open.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = self._runner.addresses[0][1]
        return self

    async def stop(self) -> None:
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    @property
    def origin(self) -> str:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} not started")
        return f"http://127.0.0.1:{self._port}"
