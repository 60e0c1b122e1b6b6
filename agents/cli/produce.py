"""Commands that write: ``produce-sample``, ``produce-file``, ``link``, ``erase``."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from agents.cli.common import (
    Bootstrap,
    CliError,
    app,
    consumer_for,
    err_console,
    fail,
    partitions_of,
    read_between,
    run,
    settings_for,
)
from agents.ingest.producer import ActionsProducer, input_dead_letter
from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from schemas import (
    InvalidMessage,
)
from schemas.connector import parse_actions
from streams.lanes import Lanes
from streams.settings import Settings
from streams.topics import ACTIONS, DEAD_LETTERS, LINKS, ensure_topics

EXIT_INVALID_RECORDS = 3
MAX_PENDING = 2000


@dataclass
class OrderedProduce:
    """Produce ``(session_id, bytes)`` in order per session, sessions concurrently.

    Each message is acknowledged by the broker before the next one of its session
    is sent. The first failure stops everything that has not been sent yet.
    """

    producer: ActionsProducer
    on_done: Callable[[bytes], None] = lambda raw: None
    error: BaseException | None = None
    sent: int = 0
    _lanes: Lanes[bytes] = field(init=False)

    def __post_init__(self) -> None:
        self._lanes = Lanes(self._send, max_pending=MAX_PENDING)

    async def _send(self, session_id: str, raw: bytes) -> None:
        if self.error is not None:
            return
        try:
            await self.producer.add_raw(session_id, raw)
        except Exception as exc:
            self.error = self.error or exc
            return
        self.sent += 1
        self.on_done(raw)

    async def all(self, items: Iterable[tuple[str, bytes]]) -> int:
        for session_id, raw in items:
            if self.error is not None:
                break
            await self._lanes.submit(session_id, raw)
        await self._lanes.join()
        if self.error is not None:
            raise self.error
        return self.sent


def progress_bar(what: str) -> Progress:
    return Progress(
        TextColumn(what),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[actions]} actions"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )


def progress_callback(progress: Progress, *, total: int) -> Callable[[bytes], None]:
    """Advance by one produced payload, counting its actions."""
    task = progress.add_task("produce", total=total, actions=0)
    actions = 0

    def advance(raw: bytes) -> None:
        nonlocal actions
        actions += len(orjson.loads(raw).get("actions") or [])
        progress.update(task, advance=1, actions=actions)

    return advance


# --------------------------------------------------------------------------- producing


@app.command("produce-sample")
def produce_sample(
    sessions: Annotated[int, typer.Option(min=1, help="How many sessions.")] = 10,
    mean_length: Annotated[int, typer.Option(min=1, help="Mean actions per session.")] = 30,
    seed: Annotated[int, typer.Option(help="Same seed, same stream.")] = 7,
    product_id: Annotated[str, typer.Option(help="product_id of every payload.")] = "prod_demo",
    session_prefix: Annotated[str, typer.Option(help="Session ids start with this.")] = "ps",
    bootstrap: Bootstrap = None,
) -> None:
    """Produce a realistic synthetic stream (agents.ingest.synthetic) into the actions topic."""
    settings = settings_for(bootstrap)
    plans = plan_sessions(sessions, mean_length=mean_length, seed=seed, prefix=session_prefix)
    items = [
        (str(p["session_id"]), orjson.dumps(p))
        for p in interleaved_payloads(plans, seed=seed, product_id=product_id)
    ]
    total_actions = sum(plan.length for plan in plans)

    async def main() -> float:
        await ensure_topics(settings)
        started = time.monotonic()
        async with ActionsProducer.from_settings(settings) as producer:
            with progress_bar(f"producing {sessions} sessions") as progress:
                advance = progress_callback(progress, total=len(items))
                await OrderedProduce(producer, on_done=advance).all(items)
        return time.monotonic() - started

    elapsed = run(settings, main())
    typer.echo(
        f"produced {len(items)} payloads ({total_actions} actions) for {sessions} sessions"
        f" to {settings.topic(ACTIONS)} in {elapsed:.1f}s"
        f" ({total_actions / max(elapsed, 1e-6):.0f} actions/s)"
    )


@dataclass
class FileRecord:
    where: str  # "line 3" or "item 3"
    number: int
    raw: bytes


def file_records(data: bytes) -> list[FileRecord]:
    """JSON lines, or one JSON array of payloads (pretty-printed or not)."""
    body = data.lstrip(b"\xef\xbb\xbf").strip()
    if body.startswith(b"["):
        try:
            items = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise CliError(f"not a valid JSON array: {exc}") from None
        return [FileRecord("item", i, orjson.dumps(item)) for i, item in enumerate(items, 1)]
    return [
        FileRecord("line", number, line.rstrip(b"\r"))
        for number, line in enumerate(data.split(b"\n"), 1)
        if line.strip()
    ]


@app.command("produce-file")
def produce_file(
    path: Annotated[
        Path, typer.Argument(help="JSON lines of ActionsPayload bodies, or a JSON array; - = stdin")
    ],
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only validate; produce nothing.")
    ] = False,
    bootstrap: Bootstrap = None,
) -> None:
    """Produce payloads from a file; invalid records are reported and dead-lettered."""
    settings = settings_for(bootstrap)
    name = "<stdin>" if str(path) == "-" else str(path)
    try:
        data = sys.stdin.buffer.read() if str(path) == "-" else path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot read {name}: {exc.strerror or exc}") from None
    try:
        records = file_records(data)
    except CliError as exc:
        raise fail(f"{name}: {exc}; nothing produced") from None

    valid: list[tuple[str, bytes]] = []
    invalid: list[tuple[FileRecord, str]] = []
    actions = 0
    for record in records:
        try:
            payload = parse_actions(record.raw)
        except InvalidMessage as exc:
            invalid.append((record, exc.reason))
            err_console.print(f"{name}:{record.where} {record.number}: {exc.reason}", markup=False)
            continue
        valid.append((payload.session_id, record.raw))
        actions += len(payload.actions)

    if dry_run:
        typer.echo(f"{len(valid)} valid payloads ({actions} actions), {len(invalid)} invalid")
        raise typer.Exit(EXIT_INVALID_RECORDS if invalid else 0)

    async def main() -> None:
        await ensure_topics(settings)
        async with ActionsProducer.from_settings(settings) as producer:
            for record, reason in invalid:
                letter = input_dead_letter(
                    record.raw,
                    reason,
                    stage="produce-file",
                    source=f"file:{name}",
                    offset=record.number,  # the line (or array item) number
                )
                await producer.dead_letter(letter)
            with progress_bar(f"producing {name}") as progress:
                advance = progress_callback(progress, total=len(valid))
                await OrderedProduce(producer, on_done=advance).all(valid)

    run(settings, main())
    typer.echo(f"produced {len(valid)} payloads ({actions} actions) to {settings.topic(ACTIONS)}")
    if invalid:
        where = ", ".join(f"{r.where} {r.number}" for r, _ in invalid[:20])
        more = f" and {len(invalid) - 20} more" if len(invalid) > 20 else ""
        typer.echo(
            f"{len(invalid)} invalid records dead-lettered to {settings.topic(DEAD_LETTERS)}"
            f" (stage produce-file): {where}{more}"
        )
        raise typer.Exit(EXIT_INVALID_RECORDS)


@app.command()
def link(
    session_id: Annotated[str, typer.Argument(help="The session.")],
    conversation_id: Annotated[str, typer.Argument(help="Its conversation (e.g. Intercom's).")],
    bootstrap: Bootstrap = None,
) -> None:
    """Tie a session to a conversation: link-aware sinks (intercom) post its context there."""
    settings = settings_for(bootstrap)

    async def main() -> Any:
        await ensure_topics(settings)
        async with ActionsProducer.from_settings(settings) as producer:
            try:
                return await producer.link(session_id, conversation_id)
            except InvalidMessage as exc:
                raise CliError(exc.reason) from None

    meta = run(settings, main())
    typer.echo(
        f"linked session {session_id} to conversation {conversation_id}"
        f" ({settings.topic(LINKS)}[{meta.partition}]@{meta.offset})"
    )


@app.command()
def erase(
    session: Annotated[list[str] | None, typer.Option(help="A session to erase.")] = None,
    user: Annotated[str | None, typer.Option(help="Every session of this user_id.")] = None,
    email: Annotated[str | None, typer.Option(help="Every session of this email.")] = None,
    reason: Annotated[str, typer.Option(help="For the audit log (a ticket, not PII).")] = "",
    bootstrap: Bootstrap = None,
) -> None:
    """Erase sessions everywhere: state, summaries, every sink's copy (README "Erasure")."""
    settings = settings_for(bootstrap)
    if not (session or user or email):
        raise fail("name what to erase: --session ID, --user ID or --email ADDRESS")

    async def main() -> list[str]:
        await ensure_topics(settings)
        wanted = set(session or [])
        if user or email:  # whose sessions: the payloads on `actions` say
            wanted |= await sessions_of(settings, user, email)
        async with ActionsProducer.from_settings(settings) as producer:
            for sid in sorted(wanted):
                await producer.erase(sid, reason=reason)
        return sorted(wanted)

    erased = run(settings, main())
    if not erased:
        raise fail("no session found for that user or email on the actions topic")
    for sid in erased:
        typer.echo(f"erase requested: session {sid}")


async def sessions_of(settings: Settings, user: str | None, email: str | None) -> set[str]:
    """The sessions whose payloads (or actions) carry ``user`` or ``email``."""
    topic = settings.topic(ACTIONS)
    consumer = consumer_for(settings)
    await consumer.start()
    found: set[str] = set()
    try:
        tps = await partitions_of(settings, topic)
        begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
        async for record in read_between(consumer, {tp: (begins[tp], ends[tp]) for tp in tps}):
            try:
                data = orjson.loads(record.value or b"")
            except orjson.JSONDecodeError:
                continue
            if not isinstance(data, dict) or not data.get("session_id"):
                continue
            people = [data, *(a for a in data.get("actions") or [] if isinstance(a, dict))]
            if any(
                (user and p.get("user_id") == user) or (email and p.get("email") == email)
                for p in people
            ):
                found.add(str(data["session_id"]))
    finally:
        await consumer.stop()
    return found
