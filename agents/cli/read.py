"""Commands that read: ``context``, ``search``, ``tail``, ``costs``."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated, Any
from urllib.parse import quote

import httpx
import orjson
import typer
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.structs import ConsumerRecord

from agents.cli.common import (
    Bootstrap,
    app,
    consumer_for,
    err_console,
    fail,
    fmt_time,
    indent,
    partitions_of,
    read_between,
    run,
    settings_for,
)
from agents.summarizer import CostReport
from schemas import (
    ActionsWritten,
    SummaryReady,
    context_operation_adapter,
)
from streams.topics import CONTEXT

DEFAULT_CONTEXT_URL = "http://127.0.0.1:6067"

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
