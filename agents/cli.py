"""``agent-context``: produce, inspect and repair a running deployment from a shell.

    agent-context produce-sample --sessions 50 --mean-length 40
    agent-context produce-file payloads.jsonl
    agent-context context SESSION_ID --url http://127.0.0.1:6067
    agent-context search "exported a CSV" --product-id prod_demo --url http://127.0.0.1:6068
    agent-context search "how do I export?" --session SESSION_ID  (the enriched query)
    agent-context tail --session SESSION_ID
    agent-context dead-letters list --limit 20
    agent-context dead-letters redrive --dry-run
    agent-context dead-letters redrive --stage sink-intercom
    agent-context link SESSION_ID CONVERSATION_ID

Every command reads the service's settings from the environment (``AC_*``, see
``streams.settings``) and accepts ``--bootstrap`` to point at another broker.
Also runnable as ``python -m agents.cli``.

Exit codes: 0 done; 1 an error (unreachable broker or sink worker, missing
topic, unreadable file), reported in one line without a traceback; 2 wrong
usage; 3 ``produce-file`` found invalid records (they were dead-lettered, the
valid ones were produced).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import httpx
import orjson
import typer
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from agents.costs import CostReport
from schemas import (
    ActionsPayload,
    ActionsWritten,
    DeadLetter,
    InvalidMessage,
    SessionLink,
    SummaryReady,
    context_operation_adapter,
    decode,
)
from streams.dead_letters import dead_letter
from streams.errors import AgentContextError, stop_on_configuration_error
from streams.lanes import Lanes
from streams.producer import ActionsProducer, ProduceError
from streams.settings import ConfigurationError, Settings, load_settings
from streams.synthetic import interleaved_payloads, plan_sessions
from streams.topics import ACTIONS, CONTEXT, DEAD_LETTERS, LINKS, ensure_topics, redrive_topic

__all__ = ["app", "main"]

T = TypeVar("T")

EXIT_ERROR = 1
EXIT_INVALID_RECORDS = 3
#: Dead-letter stages whose original bytes are an actions payload (re-drivable).
ACTIONS_STAGES = ("accumulate", "ingest", "sse", "produce-file")
#: ``sink-<name>``: a sink refused the original (an operation or link); it goes back to it.
SINK_STAGE = "sink-"
DEFAULT_CONTEXT_URL = "http://127.0.0.1:6067"
#: A read that makes no progress for this long is reported instead of hanging.
READ_STALL_S = 30.0
MAX_PENDING = 2000

app = typer.Typer(
    name="agent-context",
    help="Produce, inspect and repair an agent-context deployment (settings from AC_* env).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
dead_letters_app = typer.Typer(
    help="Inspect dead letters and re-drive the ones that now parse.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(dead_letters_app, name="dead-letters")

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


# --------------------------------------------------------------------------- plumbing


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


def validate_actions(raw: bytes) -> ActionsPayload:
    """What :meth:`ActionsProducer.add` accepts, on the exact bytes to be produced."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None
    if isinstance(data, dict) and data.get("type", "actions") != "actions":
        raise InvalidMessage(f"not an actions payload: type={data.get('type')!r}")
    return decode(ActionsPayload, raw)


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


def fmt_time(ts: float) -> str:
    if ts <= 0:
        return "-"
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def preview(raw: bytes, width: int = 100) -> str:
    text = raw.decode("utf-8", "replace").replace("\n", "\\n")
    return text if len(text) <= width else text[: width - 1] + "…"


def indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


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
    """Produce a realistic synthetic stream (streams.synthetic) into the actions topic."""
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


def session_hint(raw: bytes) -> str | None:
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    sid = data.get("session_id") if isinstance(data, dict) else None
    return sid if isinstance(sid, str) and sid else None


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
            payload = validate_actions(record.raw)
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
                await producer.dead_letter(
                    dead_letter(
                        reason,
                        "produce-file",
                        record.raw,
                        source_topic=f"file:{name}",
                        offset=record.number,  # the line (or array item) number
                        key=session_hint(record.raw),
                    )
                )
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


# --------------------------------------------------------------------------- reading


ApiToken = Annotated[
    str | None,
    typer.Option(envvar="AC_API_TOKEN", help="The workers' API token, if they require one."),
]


def get_json(
    url: str, address: str, params: dict[str, Any], token: str | None, worker: str, missing: str
) -> Any:
    """GET a worker's JSON endpoint; every way it can fail is one line naming what to do."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(
            address, params=params, timeout=30.0, follow_redirects=True, headers=headers
        )
    except httpx.HTTPError as exc:
        raise fail(
            f"cannot reach {url} ({type(exc).__name__}); is {worker} running there?"
        ) from None
    if response.status_code == 404:
        raise fail(f"{missing} at {url}")
    if response.status_code == 401:
        raise fail(f"{url} wants the API token: set AC_API_TOKEN (or --token)")
    if response.status_code != 200:
        raise fail(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
    try:
        return response.json()
    except ValueError:
        raise fail(f"{url} did not answer JSON: {response.text[:200]}") from None


@app.command()
def context(
    session_id: Annotated[str, typer.Argument(help="The session to show.")],
    url: Annotated[
        str,
        typer.Option(envvar="AC_CONTEXT_URL", help="A sink worker's web address."),
    ] = DEFAULT_CONTEXT_URL,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    token: ApiToken = None,
) -> None:
    """Show a session's current context, as a sink worker's pull view has it."""
    address = f"{url.rstrip('/')}/sessions/{quote(session_id, safe='')}/context"
    view = get_json(
        url,
        address,
        {},
        token,
        "`faust -A sinks.app worker`",
        f"no context for session {session_id!r}",
    )
    if as_json:
        typer.echo(orjson.dumps(view, option=orjson.OPT_INDENT_2).decode())
        return
    typer.echo(render_context(view))


@app.command()
def search(
    query: Annotated[str, typer.Argument(help="What to look for (or the agent's question).")],
    url: Annotated[
        str, typer.Option(envvar="AC_VECTOR_URL", help="The vector sink worker's web address.")
    ] = DEFAULT_CONTEXT_URL,
    product_id: Annotated[str | None, typer.Option(help="Only this product's sessions.")] = None,
    k: Annotated[int, typer.Option(min=1, max=100, help="How many sessions.")] = 5,
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Enrich the query with this session.")
    ] = None,
    related: Annotated[int, typer.Option(min=0, max=20, help="With --session.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the raw JSON.")] = False,
    token: ApiToken = None,
) -> None:
    """Search current summaries (vector sink), or enrich a query with a session's context."""
    params: dict[str, Any] = {"q": query}
    if product_id:
        params["product_id"] = product_id
    if session:
        address = f"{url.rstrip('/')}/sessions/{quote(session, safe='')}/enrich"
        params["related"] = related
    else:
        address, params["k"] = f"{url.rstrip('/')}/search", k
    worker = "`AC_SINK=vector faust -A sinks.app worker`"
    body = get_json(url, address, params, token, worker, f"no session {session!r}")
    if as_json:
        typer.echo(orjson.dumps(body, option=orjson.OPT_INDENT_2).decode())
    elif session:
        typer.echo(body["text"])
    else:
        for hit in body["results"] or []:
            covers = hit["seq_range"]
            typer.echo(
                f"{hit['score']:.3f}  {hit['session_id']}  actions {covers[0]}-{covers[1]}"
                f"  {hit['summary']}"
            )


def render_context(view: dict[str, Any]) -> str:
    applied = view.get("actions_applied", 0)
    summaries = view.get("summaries", 0)
    covers = view.get("summary_covers")
    state = "closed (idle)" if view.get("closed") else "open"
    head = f"Session {view.get('session_id')}: {applied} actions applied, {summaries} summaries"
    if covers:
        head += f" (current summary covers {covers[0]}-{covers[1]})"
    pending = len(view.get("actions") or [])
    head += f", {pending} raw batches since, {state}"
    body = (view.get("text") or "").rstrip("\n") or "(empty)"
    return f"{head}\n{'─' * min(len(head), 80)}\n{body}"


def describe_operation(record: ConsumerRecord) -> str:
    try:
        op = context_operation_adapter.validate_json(record.value or b"")
    except ValueError as exc:
        reason = str(exc).splitlines()[0]
        return f"[p{record.partition}@{record.offset}] invalid operation: {reason}"
    where = f"p{record.partition}@{record.offset}"
    gen = f" gen {op.generation}" if op.generation else ""
    if isinstance(op, ActionsWritten):
        n = op.seq_to - op.seq_from + 1
        head = (
            f"{fmt_time(op.emitted_at)}  {op.session_id}  actions_written"
            f"  #{op.seq_from}-{op.seq_to} ({n} actions){gen}  [{where}]"
        )
        return head + "\n" + indent("\n".join(a.to_text() for a in op.payload.actions))
    assert isinstance(op, SummaryReady)
    final = "  final" if op.final else ""
    head = (
        f"{fmt_time(op.emitted_at)}  {op.session_id}  summary_ready"
        f"  #{op.seq_from}-{op.seq_to} (new {op.window_from}-{op.seq_to}){gen}{final}  [{where}]"
    )
    return head + "\n" + indent(op.summary)


@app.command()
def tail(
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="Start at the oldest operation kept.")
    ] = False,
    session: Annotated[
        str | None, typer.Option("--session", "-s", help="Only this session's operations.")
    ] = None,
    count: Annotated[
        int | None, typer.Option("--count", "-n", min=1, help="Exit after this many operations.")
    ] = None,
    bootstrap: Bootstrap = None,
) -> None:
    """Print the context operations as sinks receive them (no consumer group)."""
    settings = settings_for(bootstrap)
    topic = settings.topic(CONTEXT)

    async def main() -> None:
        consumer = consumer_for(settings)
        await consumer.start()
        try:
            tps = await partitions_of(settings, topic)
            wanted = session.encode() if session is not None else None
            if wanted is not None:  # a session lives on one partition: read only that one
                index = DefaultPartitioner()(wanted, [tp.partition for tp in tps], None)
                tps = [TopicPartition(topic, index)]
            consumer.assign(tps)
            if from_beginning:
                await consumer.seek_to_beginning(*tps)
            else:
                await consumer.seek_to_end(*tps)
            shown = 0
            err_console.print(f"tailing {topic} (Ctrl-C to stop)", markup=False)
            async for record in consumer:
                if wanted is not None and record.key != wanted:
                    continue
                typer.echo(describe_operation(record))
                sys.stdout.flush()
                shown += 1
                if count is not None and shown >= count:
                    return
        finally:
            await consumer.stop()

    run(settings, main())


@app.command()
def costs(
    since: Annotated[
        str | None, typer.Option(help="From this UTC time (ISO 8601, e.g. 2026-12-01T00:00).")
    ] = None,
    until: Annotated[str | None, typer.Option(help="Until this UTC time (ISO 8601).")] = None,
    sessions: Annotated[int, typer.Option(min=0, help="Show the N costliest sessions.")] = 10,
    bootstrap: Bootstrap = None,
) -> None:
    """LLM tokens and cost per product and per session, from the summaries on `context`."""
    settings = settings_for(bootstrap)
    topic = settings.topic(CONTEXT)
    window = [parse_utc(t) if t else None for t in (since, until)]

    async def main() -> CostReport:
        report = CostReport()
        consumer = consumer_for(settings)
        await consumer.start()
        try:
            tps = await partitions_of(settings, topic)
            begins, ends = await consumer.beginning_offsets(tps), await consumer.end_offsets(tps)
            async for record in read_between(consumer, {tp: (begins[tp], ends[tp]) for tp in tps}):
                at = record.timestamp / 1000
                if (window[0] and at < window[0]) or (window[1] and at >= window[1]):
                    continue
                try:
                    op = context_operation_adapter.validate_json(record.value or b"")
                except ValueError:  # not an operation: `tail` shows those
                    continue
                if isinstance(op, SummaryReady) and op.usage is not None:
                    report.add(op.product_id, op.session_id, op.usage)
        finally:
            await consumer.stop()
        return report

    for line in run(settings, main()).lines(sessions):
        typer.echo(line)


def parse_utc(text: str) -> float:
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise fail(f"not an ISO 8601 time: {text!r} (e.g. 2026-12-01T00:00)") from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


# --------------------------------------------------------------------------- dead letters


def letter_identity(letter: DeadLetter) -> tuple[Any, ...]:
    """Two dead letters of the same input (a replay wrote it again) share this."""
    if letter.partition >= 0 and letter.offset >= 0:
        return ("at", letter.source_topic, letter.partition, letter.offset)
    return ("bytes", hashlib.sha256(letter.original).hexdigest())


def describe_letter(record: ConsumerRecord, letter: DeadLetter) -> str:
    source = (
        f"{letter.source_topic}[{letter.partition}]@{letter.offset}"
        if letter.partition >= 0
        else f"{letter.source_topic}#{letter.offset}"
        if letter.offset >= 0
        else letter.source_topic
    )
    original = letter.original
    return (
        f"{fmt_time(letter.failed_at)}  {letter.stage}  {source}  key={letter.key}"
        f"  [p{record.partition}@{record.offset}]\n"
        f"    reason: {letter.reason}\n"
        f"    original ({len(original)} bytes): {preview(original)}"
    )


@dead_letters_app.command("list")
def list_dead_letters(
    limit: Annotated[int, typer.Option(min=1, help="Show at most this many, newest last.")] = 20,
    stage: Annotated[
        str | None, typer.Option(help="Only letters from this stage (accumulate, ...).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    bootstrap: Bootstrap = None,
) -> None:
    """Show the most recent dead letters with their reason and original bytes."""
    settings = settings_for(bootstrap)
    topic = settings.topic(DEAD_LETTERS)

    async def main() -> tuple[int, list[tuple[ConsumerRecord, DeadLetter | None]]]:
        consumer = consumer_for(settings)
        await consumer.start()
        try:
            tps = await partitions_of(settings, topic)
            begins = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            total = sum(ends[tp] - begins[tp] for tp in tps)
            # Unfiltered, the newest ``limit`` overall are among each partition's last ``limit``.
            ranges = {
                tp: (begins[tp] if stage else max(begins[tp], ends[tp] - limit), ends[tp])
                for tp in tps
            }
            found: list[tuple[ConsumerRecord, DeadLetter | None]] = []
            async for record in read_between(consumer, ranges):
                try:
                    letter = decode(DeadLetter, record.value)
                except InvalidMessage:
                    letter = None
                if stage is None or (letter is not None and letter.stage == stage):
                    found.append((record, letter))
            found.sort(key=lambda item: item[1].failed_at if item[1] else item[0].timestamp / 1e3)
            return total, found[-limit:]
        finally:
            await consumer.stop()

    total, letters = run(settings, main())
    if as_json:
        for record, letter in letters:
            line: dict[str, Any] = {"partition": record.partition, "offset": record.offset}
            line.update(letter.model_dump() if letter else {"unreadable": preview(record.value)})
            typer.echo(orjson.dumps(line).decode())
        return
    scope = f" from stage {stage}" if stage else ""
    typer.echo(f"{total} dead letters in {topic}; the last {len(letters)}{scope}:")
    for record, letter in letters:
        if letter is None:
            typer.echo(f"[p{record.partition}@{record.offset}] unreadable dead letter")
        else:
            typer.echo(describe_letter(record, letter))


@dataclass
class RedriveReport:
    examined: int = 0
    redriven: int = 0
    duplicates: int = 0
    other_stages: Counter[str] = field(default_factory=Counter)
    unreadable: int = 0
    still_invalid: list[tuple[ConsumerRecord, DeadLetter, str]] = field(default_factory=list)


@dataclass(frozen=True)
class RedriveTarget:
    """Where some stages' dead letters go back to, and the group keeping their place.

    Each target has its own consumer group: a run for one stage must not commit
    past another stage's letters, which a later run for that stage still needs.
    """

    stages: frozenset[str]
    topic: str
    group: str
    validate: Callable[[bytes], str]  # the session to key by; raises InvalidMessage


def validate_sink_original(raw: bytes) -> str:
    """A sink's dead letter holds a context operation or a link; its session."""
    try:
        return context_operation_adapter.validate_json(raw).session_id
    except ValueError:
        pass
    return decode(SessionLink, raw).session_id


def redrive_targets(settings: Settings, stages: set[str]) -> list[RedriveTarget]:
    targets = []
    if actions := stages & set(ACTIONS_STAGES):
        targets.append(
            RedriveTarget(
                frozenset(actions),
                settings.topic(ACTIONS),
                f"{settings.app_id}-redrive",
                lambda raw: validate_actions(raw).session_id,
            )
        )
    for stage in sorted(stages - set(ACTIONS_STAGES)):
        targets.append(
            RedriveTarget(
                frozenset([stage]),
                settings.topic(redrive_topic(stage)),
                f"{settings.app_id}-redrive-{stage}",
                validate_sink_original,
            )
        )
    return targets


@dead_letters_app.command("redrive")
def redrive(
    stage: Annotated[
        list[str] | None,
        typer.Option(
            help=(
                f"Stages to re-drive (repeatable; 'all' = {', '.join(ACTIONS_STAGES)});"
                " sink-<name> sends a sink's refused operations back to that sink only."
            ),
            show_default="accumulate",
        ),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report only: produce and commit nothing.")
    ] = False,
    bootstrap: Bootstrap = None,
) -> None:
    """Re-drive dead letters whose original bytes now parse back to where they failed.

    Actions payloads go back into the actions topic; a sink's letters (stage
    sink-<name>) to its re-drive topic, which only that sink's worker reads, in
    their original order per session. Letters are read from where the previous
    run for the same stages stopped (consumer group <app_id>-redrive, or
    <app_id>-redrive-sink-<name>) to the end of the topic as it is now; each one
    is re-driven at most once, keyed by its session. Letters that still do not
    parse are reported and passed over; the group's offsets are committed after
    the run.
    """
    settings = settings_for(bootstrap)
    stages = set(stage or ["accumulate"])
    if "all" in stages:
        stages = (stages - {"all"}) | set(ACTIONS_STAGES)
    is_sink = {s for s in stages if s.startswith(SINK_STAGE) and len(s) > len(SINK_STAGE)}
    unknown = stages - set(ACTIONS_STAGES) - is_sink
    if unknown:
        raise fail(
            f"cannot re-drive stage {', '.join(sorted(unknown))}: only"
            f" {', '.join(ACTIONS_STAGES)} (into actions) and sink-<name> (back to that sink)"
            " dead letters can be",
            2,
        )
    targets = redrive_targets(settings, stages)
    topic = settings.topic(DEAD_LETTERS)

    async def main() -> list[RedriveReport]:
        if not dry_run:
            await ensure_topics(settings, [redrive_topic(s) for s in is_sink])
        producer = ActionsProducer.from_settings(settings, client_id="agent-context-redrive")
        try:
            return [await redrive_target(settings, target, producer, dry_run) for target in targets]
        finally:
            await producer.stop()

    reports = run(settings, main())
    verb = "would re-drive" if dry_run else "re-driven"
    for target, report in zip(targets, reports, strict=True):
        typer.echo(f"examined {report.examined} dead letters in {topic} (group {target.group})")
        typer.echo(f"  {verb} into {target.topic}: {report.redriven}")
        typer.echo(f"  still invalid: {len(report.still_invalid)}")
        typer.echo(f"  duplicates skipped: {report.duplicates}")
        others = ", ".join(f"{k}: {v}" for k, v in sorted(report.other_stages.items()))
        left = sum(report.other_stages.values())
        typer.echo(f"  other stages left alone: {left} ({others or '-'})")
        if report.unreadable:
            typer.echo(f"  unreadable dead letters: {report.unreadable}")
        for record, letter, reason in report.still_invalid[:20]:
            typer.echo(describe_letter(record, letter.model_copy(update={"reason": reason})))
    if dry_run:
        typer.echo("dry run: nothing produced, no offsets committed")


async def redrive_target(
    settings: Settings, target: RedriveTarget, producer: ActionsProducer, dry_run: bool
) -> RedriveReport:
    """One target's letters, from its group's committed offsets to the end now."""
    report = RedriveReport()
    consumer = consumer_for(settings, group_id=target.group)
    await consumer.start()
    done: dict[TopicPartition, int] = {}

    async def commit() -> None:
        if done and not dry_run:
            await consumer.commit({tp: OffsetAndMetadata(o, "") for tp, o in done.items()})

    try:
        tps = await partitions_of(settings, settings.topic(DEAD_LETTERS))
        begins = await consumer.beginning_offsets(tps)
        ends = await consumer.end_offsets(tps)
        ranges = {}
        for tp in tps:
            committed = await consumer.committed(tp)
            ranges[tp] = (max(committed or 0, begins[tp]), ends[tp])
        seen: set[tuple[Any, ...]] = set()
        async for record in read_between(consumer, ranges):
            await redrive_one(record, report, seen, producer, target, dry_run)
            done[TopicPartition(record.topic, record.partition)] = record.offset + 1
        done = {tp: end for tp, (start, end) in ranges.items() if start < end}
    except BaseException:
        # What was re-driven before the failure must not be re-driven next time.
        with contextlib.suppress(Exception):
            await commit()
        raise
    else:
        await commit()
    finally:
        await consumer.stop()
    return report


async def redrive_one(
    record: ConsumerRecord,
    report: RedriveReport,
    seen: set[tuple[Any, ...]],
    producer: ActionsProducer,
    target: RedriveTarget,
    dry_run: bool,
) -> None:
    report.examined += 1
    try:
        letter = decode(DeadLetter, record.value)
    except InvalidMessage:
        report.unreadable += 1
        return
    if letter.stage not in target.stages:
        report.other_stages[letter.stage] += 1
        return
    identity = letter_identity(letter)
    if identity in seen:
        report.duplicates += 1
        return
    seen.add(identity)
    original = letter.original
    try:
        session_id = target.validate(original)
    except InvalidMessage as exc:
        report.still_invalid.append((record, letter, exc.reason))
        return
    if not dry_run:
        await producer.send_raw(target.topic, session_id, original)
    report.redriven += 1


@stop_on_configuration_error()
def main() -> None:
    app(prog_name="agent-context")


if __name__ == "__main__":
    main()
