"""Plumbing every command shares: the app, settings, one-line errors, reading topics."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import AsyncIterator, Coroutine
from datetime import datetime
from typing import Annotated, Any, TypeVar

import typer
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.structs import ConsumerRecord
from rich.console import Console

from agents.ingest.producer import ProduceError
from streams.errors import AgentContextError
from streams.settings import ConfigurationError, Settings, load_settings

T = TypeVar("T")

EXIT_ERROR = 1
#: A read that makes no progress for this long is reported instead of hanging.
READ_STALL_S = 30.0

app = typer.Typer(
    name="agent-context",
    help="Produce, inspect and repair an agent-context deployment (settings from AC_* env).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

err_console = Console(stderr=True, highlight=False, soft_wrap=True)

Bootstrap = Annotated[
    str | None,
    typer.Option(
        "--bootstrap",
        "-b",
        help="Kafka bootstrap servers (default: KAFKA_BOOTSTRAP_SERVERS, else 127.0.0.1:9092).",
        show_default=False,
    ),
]


class CliError(AgentContextError):
    """A user-facing failure: printed as one line, exit code 1, no traceback."""


@app.callback()
def _options(
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log what the Kafka client does.")
    ] = False,
) -> None:
    logging.basicConfig(
        level=logging.INFO if verbose else logging.CRITICAL,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def settings_for(bootstrap: str | None) -> Settings:
    try:
        settings = load_settings()
    except ConfigurationError as exc:
        raise fail(str(exc)) from None
    if bootstrap:
        settings = settings.model_copy(update={"kafka_bootstrap_servers": bootstrap})
    return settings


def fail(message: str, code: int = EXIT_ERROR) -> typer.Exit:
    err_console.print(f"error: {message}", markup=False)
    return typer.Exit(code)


def run(settings: Settings, main: Coroutine[Any, Any, T]) -> T:
    """Run ``main``; turn the failures a user can cause or fix into a one-line error."""
    where = settings.kafka_bootstrap_servers
    try:
        return asyncio.run(main)
    except CliError as exc:
        raise fail(str(exc)) from None
    except KafkaConnectionError:
        raise fail(f"cannot connect to Kafka at {where}") from None
    except ProduceError as exc:
        raise fail(f"{exc} (Kafka at {where})") from None
    except KafkaError as exc:
        raise fail(f"Kafka at {where}: {type(exc).__name__}: {exc}") from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def consumer_for(settings: Settings, *, group_id: str | None = None) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=settings.kafka_bootstrap_servers,
        group_id=group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        client_id="agent-context-cli",
        max_partition_fetch_bytes=8 * 1024 * 1024,  # a dead letter of a 1 MB message
    )


async def partitions_of(settings: Settings, topic: str) -> list[TopicPartition]:
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.kafka_bootstrap_servers, client_id="agent-context-cli"
    )
    await admin.start()
    try:
        described = await admin.describe_topics([topic])
    finally:
        await admin.close()
    partitions = [
        p["partition"] for t in described if t.get("error_code") == 0 for p in t["partitions"]
    ]
    if not partitions:
        raise CliError(f"topic {topic!r} does not exist (start a worker or produce first)")
    return [TopicPartition(topic, p) for p in sorted(partitions)]


async def read_between(
    consumer: AIOKafkaConsumer, ranges: dict[TopicPartition, tuple[int, int]]
) -> AsyncIterator[ConsumerRecord]:
    """The records of each partition in ``[start, end)``, in offset order per partition."""
    ends = {tp: end for tp, (start, end) in ranges.items() if start < end}
    if not ends:
        return
    consumer.assign(list(ends))
    for tp in ends:
        consumer.seek(tp, ranges[tp][0])
    last_progress = time.monotonic()
    while ends:
        batch = await consumer.getmany(*ends, timeout_ms=500)
        for tp, records in batch.items():
            for record in records:
                if record.offset < ends.get(tp, -1):
                    last_progress = time.monotonic()
                    yield record
        for tp in list(ends):
            if await consumer.position(tp) >= ends[tp]:
                del ends[tp]
        if ends and time.monotonic() - last_progress > READ_STALL_S:
            behind = ", ".join(f"{tp.topic}[{tp.partition}]" for tp in ends)
            raise CliError(f"no progress reading {behind} for {READ_STALL_S:.0f}s")


def fmt_time(ts: float) -> str:
    if ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def preview(raw: bytes, width: int = 100) -> str:
    text = raw.decode("utf-8", "replace").replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())
