"""Long-running ingest: ``ingest`` (the connector's webhooks over HTTP) and ``sse-bridge``."""

from __future__ import annotations

import asyncio
import logging
import signal
from typing import Annotated

import typer
from aiohttp import web

from agents.cli.common import Bootstrap, fail, settings_for
from agents.ingest.http import ingest_app_from_settings, load_ingest_settings
from agents.ingest.producer import ActionsProducer
from agents.ingest.sse import BridgeSettings, SSEBridge, SSEBridgeFatal
from streams.settings import ConfigurationError, Settings, from_environment
from streams.topics import ensure_topics

log = logging.getLogger("agents.ingest")


def ingest(
    host: Annotated[
        str | None, typer.Option(help="Listen here (default: AC_INGEST_HOST, 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=0, max=65535, help="Port (default: AC_INGEST_PORT, 8080).")
    ] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Serve the connector's webhook (POST /webhook) and Intercom's (POST /intercom)."""
    settings = settings_for(bootstrap)
    try:
        ingest_settings = load_ingest_settings()
    except ConfigurationError as exc:
        raise fail(str(exc)) from None
    options = {key: value for key, value in (("host", host), ("port", port)) if value is not None}
    ingest_settings = ingest_settings.model_copy(update=options)
    logging.getLogger().setLevel(logging.INFO)

    async def build() -> web.Application:
        try:
            await ensure_topics(settings)
        except Exception as exc:  # the producer reconnects; requests get 503 until then
            log.warning("ingest: could not ensure topics (%s)", exc)
        return ingest_app_from_settings(settings, ingest_settings)

    where = (ingest_settings.host, ingest_settings.port)
    log.info("ingest: listening on http://%s:%d", *where)
    web.run_app(build(), host=where[0], port=where[1], access_log=None, print=None)


def sse_bridge(bootstrap: Bootstrap = None) -> None:
    """Bridge a connector's SSE stream (AC_SSE_URL, AC_SSE_TOKEN) into the actions topic."""
    settings = settings_for(bootstrap)
    try:
        bridge_settings = from_environment(BridgeSettings, "AC_SSE_")
    except ConfigurationError as exc:
        raise fail(str(exc)) from None
    logging.getLogger().setLevel(logging.INFO)
    try:
        asyncio.run(bridge(settings, bridge_settings))
    except SSEBridgeFatal as exc:
        raise fail(str(exc)) from None


async def bridge(settings: Settings, bridge_settings: BridgeSettings) -> None:
    """Until SIGINT or SIGTERM; a payload being produced is finished first."""
    async with ActionsProducer.from_settings(settings) as producer:
        running = SSEBridge.from_settings(bridge_settings, producer)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, running.stop)
        await running.run()
