"""The Faust application factory shared by the pipeline worker and sink workers.

The pipeline (``faust -A agents.app worker``) and each sink
(``faust -A sinks.app worker``) are separate Faust apps, so each has its own
consumer group: a slow destination never holds back the pipeline or another sink.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import logging
import os
import socket
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp.web
from aiokafka.structs import RecordMetadata

from streams._faust.app_base import FaustApp
from streams._faust.appender import Appender
from streams.lanes import Lanes
from streams.observe import metrics, stalls
from streams.settings import ConfigurationError, Settings
from streams.topics import DEAD_LETTER_MAX_BYTES, ensure_topics

__all__ = ["ContextApp", "create_app", "worker_command"]

log = logging.getLogger(__name__)

EXIT_ON_BUG = 70  # EX_SOFTWARE: an internal error (see ContextApp.crash_on_lane_error)


class ContextApp(FaustApp):
    """A Faust app that knows its settings and creates its topics before it consumes."""

    settings: Settings

    def __init__(self, app_id: str, settings: Settings, **options: Any) -> None:
        super().__init__(app_id, **options)
        self.settings = settings
        self._mounts: list[tuple[str, Callable[[], aiohttp.web.Application]]] = []
        self._lanes: list[Lanes[Any]] = []
        self._stopping = False
        # Topics of this worker alone (a sink's re-drive topic), created with the others.
        self.own_topics: list[str] = []
        self._shutdown_hooks: list[Callable[[], Awaitable[None]]] = []

    async def produce(
        self, topic: str, key: bytes, value: bytes | None, partition: int | None = None
    ) -> Awaitable[RecordMetadata]:
        """Hand a record to the app's producer; the result resolves when the broker has it.

        Faust's ``Producer.send`` around the same call (a sensor signal, header
        conversion, a transaction lookup, none of which these workers use) cost
        4-6% of a worker's CPU on the hot paths (py-spy). Failures raise
        aiokafka's errors, unwrapped.
        """
        return cast(
            Awaitable[RecordMetadata],
            await self.aiokafka_producer().send(topic, value, key=key, partition=partition),
        )

    async def append(
        self, topic: str, key: bytes, value: bytes | None
    ) -> Awaitable[RecordMetadata]:
        """``produce`` through the appender (one batch per partition per event-loop round),
        or directly while the producer has no metadata for ``topic`` yet."""
        appended = self.appender.append_keyed(topic, key, value)
        return appended if appended is not None else await self.produce(topic, key, value)

    @functools.cached_property
    def appender(self) -> Appender:
        """Batches records per partition for the hot paths' table writes (``_faust.appender``)."""
        conf = self.conf
        # The compiled batch builder writes neither a codec nor a transaction's marker.
        plain = not conf.producer_compression_type and conf.processing_guarantee.value == (
            "at_least_once"
        )
        return Appender(
            self.aiokafka_producer,
            max_wait_s=self.settings.changelog_round_ms / 1000,
            batch_bytes=conf.producer_max_batch_size if plain else None,
        )

    def consumer_on_loop(self) -> bool:
        return not self.settings.consumer_thread

    def mount(self, prefix: str, factory: Callable[[], aiohttp.web.Application]) -> None:
        """Serve another aiohttp application (e.g. the HTTP ingest) on this worker's port."""
        self._mounts.append((prefix, factory))

    def on_webserver_init(self, web: Any) -> None:
        # Called by Faust just before its aiohttp router is frozen.
        for prefix, factory in self._mounts:
            web.web_app.add_subapp(prefix, factory())

    def manage_lanes(self, lanes: Lanes[Any], stage: str) -> None:
        """Watch ``lanes`` for stalls, and bound how long a stop waits for them.

        A lane that waits for ever holds its session and, through in-order
        acknowledgement, the commits of its partition, and nothing else shows it:
        items in progress for ``stall_warning_s`` or more are reported (a warning
        naming the sessions and what each waits on, and two gauges).
        """
        self._lanes.append(lanes)
        threshold = self.settings.stall_warning_s
        stalled_gauge = metrics.LANES_STALLED.labels(stage)
        oldest_gauge = metrics.OLDEST_LANE_ITEM.labels(stage)

        async def report_stalled_lanes() -> None:
            busy = lanes.in_progress()  # longest first
            stalled = [entry for entry in busy if entry[1] >= threshold]
            stalled_gauge.set(len(stalled))
            oldest_gauge.set(busy[0][1] if busy else 0.0)
            if stalled:
                shown = ", ".join(f"{key} ({age:.0f}s, {at})" for key, age, at in stalled[:5])
                log.warning(
                    "%s: %d session(s) on one message for over %.0fs: %s",
                    stage,
                    len(stalled),
                    threshold,
                    shown,
                )

        self.timer(max(threshold / 4, 1.0), name=f"{stage}.report_stalled_lanes")(
            report_stalled_lanes
        )

    async def on_stop(self) -> None:
        self._stopping = True
        await super().on_stop()

    def at_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run ``hook`` once the consumer and the agents have stopped (a sink's aclose)."""
        self._shutdown_hooks.append(hook)

    async def on_shutdown(self) -> None:
        for hook in self._shutdown_hooks:
            try:
                await hook()
            except Exception:
                log.exception("shutdown hook %r raised", hook)
        await super().on_shutdown()

    def fetch_wait(self) -> tuple[int, int]:
        return self.settings.fetch_min_bytes, self.settings.fetch_max_wait_ms

    def stop_grace_s(self) -> float | None:
        # Bounded on a stop only (a test's destination went away under a sink, which
        # then never stopped); rebalances keep Faust's unbounded wait.
        return self.settings.stop_grace_s if self._stopping else None

    async def abandon_in_progress(self, waited_s: float) -> None:
        busy = sum(lanes.active_keys for lanes in self._lanes)
        log.warning(
            "stopping with %d session(s) still in progress after %.0fs; their messages "
            "are not committed and are redelivered after the restart",
            busy,
            waited_s,
        )
        for lanes in self._lanes:
            await lanes.close()

    async def crash_on_lane_error(self, key: str, exc: BaseException) -> None:
        """``Lanes(on_error=...)``: a bug processed a session's message. Exit non-zero
        rather than skip the message or stall its partition: it is not acknowledged,
        so it is redelivered when the supervisor restarts the worker.

        Not Faust's graceful stop: that waits for every delivered message to be
        acknowledged (``stream_wait_empty``), which this one never will be, and
        ``App.crash`` stops the consumer a final commit still needs (both
        seen hanging). What is acknowledged is committed first (it never passes
        the failed message, see ``InOrderAcks``); the rest replays idempotently,
        as after a ``kill -9``.
        """
        log.critical(
            "session %s: unexpected %s: %s; exiting with status %d so that the worker is "
            "restarted and the message redelivered",
            key,
            type(exc).__name__,
            exc,
            EXIT_ON_BUG,
        )
        try:
            await asyncio.wait_for(self.consumer.commit(), timeout=5)
        except Exception:
            log.warning("commit before exiting failed", exc_info=True)
        logging.shutdown()
        os._exit(EXIT_ON_BUG)

    async def on_first_start(self) -> None:
        where = "its own thread" if self.settings.consumer_thread else "the worker's event loop"
        log.info("Kafka consumer: on %s", where)
        _calm_the_garbage_collector()
        stalls.time_gc_pauses()
        self.add_future(stalls.watch_event_loop())
        Path(self.conf.datadir).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (start-up)
        changelogs = [table.changelog_topic.get_topic_name() for table in self.tables.values()]
        await ensure_topics(self.settings, self.own_topics, changelogs)
        await super().on_first_start()


# A young collection fires when the live tracked objects rise this far above their lowest
# since the last one. Below the in-flight work's swing (a backlog: over 200,000) it fired
# every second, 30-150 ms each, freeing nothing: tests/unit/test_gc_thresholds.py.
GC_YOUNG_THRESHOLD = 400_000


def _calm_the_garbage_collector() -> None:
    """Rare cyclic-GC passes. A young collection walks every young object that is still
    alive, and the worker's in-flight work (fetched records, units, summarize requests)
    is: on a backlog a pass cost 30-150 ms and freed nothing, 7% of the pipeline's CPU
    (docs/performance.md, session 20). Objects that exist after start-up (modules, app,
    settings) are frozen out of the scans."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG_THRESHOLD, 50, 100)


def require_broker(settings: Settings) -> None:
    """Wait up to ``AC_BROKER_WAIT_S`` for a bootstrap server to accept a connection, else
    stop with one line naming them (Faust's own failure is a 40-line traceback)."""
    servers = [s.strip() for s in settings.kafka_bootstrap_servers.split(",") if s.strip()]
    deadline = time.monotonic() + settings.broker_wait_s
    reason: object = "no server named"
    while True:
        for server in servers:
            host, _, port = server.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
                return
            except (OSError, ValueError) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        if time.monotonic() >= deadline:
            raise ConfigurationError(
                f"cannot reach the Kafka broker at {','.join(servers)} ({reason}) within "
                f"{settings.broker_wait_s:g}s: is it running, and is KAFKA_BOOTSTRAP_SERVERS "
                "its address?"
            )
        time.sleep(0.5)  # start-up, before any event loop: nothing else to do meanwhile


def create_app(settings: Settings, role: str) -> ContextApp:
    """``role`` is ``pipeline`` or ``sink-<name>``; it names the consumer group."""
    app_id = settings.app_id if role == "pipeline" else f"{settings.app_id}-{role}"
    return ContextApp(
        app_id,
        settings,
        broker=settings.broker_url,
        store=settings.store,
        datadir=str(settings.data_dir / role),
        topic_partitions=settings.partitions,
        topic_replication_factor=1,
        # ensure_topics creates every topic, changelogs included; Faust's creation asks one
        # broker and failed while it was down (test_a_broker_down_past_the_session_timeout...).
        topic_allow_declare=False,
        topic_disable_leader=True,
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        producer_linger=settings.producer_linger_ms / 1000,
        producer_max_batch_size=settings.producer_batch_bytes,
        # Lets a dead letter of a message at the broker's limit through (the
        # dead-letter topic accepts it); every other topic is guarded by
        # MESSAGE_MAX_BYTES where messages are built (agents/accumulate/stage.py).
        producer_max_request_size=DEAD_LETTER_MAX_BYTES,
        # Faust's default is 1 MiB: one backlog fetch held ~40 MiB more (test_consumer_loop.py,
        # test_a_fetch_takes_at_most_the_configured_bytes_per_partition); larger records still come.
        consumer_max_fetch_size=settings.fetch_partition_bytes,
        broker_commit_interval=1.0,
        broker_session_timeout=settings.broker_session_timeout_s,
        table_standby_replicas=0,
        web_host=settings.web_host,
        # Faust binds 0.0.0.0 by default whatever web_host says, and serves its table
        # browser (/table/<name>/<key>/: sessions' actions) to anyone who can reach it.
        web_bind=settings.web_host,
        web_tables_enabled=False,
        web_router_enabled=False,
        web_port=settings.web_port,
        web_in_thread=False,
    )


def worker_command(module: str, web_port: int, web_host: str = "127.0.0.1") -> list[str]:
    """The command line of ``faust -A <module> worker``, as the demo, the bench and the
    tests start it (``-l info``: at ``warn`` Faust's spinner logs a DEBUG record per message)."""
    faust = [sys.executable, "-m", "faust", "-A", module, "worker", "-l", "info"]
    return [*faust, "--web-port", str(web_port), "--web-host", web_host]
