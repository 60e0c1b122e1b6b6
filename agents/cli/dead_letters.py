"""``dead-letters list`` and ``dead-letters redrive``."""

from __future__ import annotations

import contextlib
import hashlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

import orjson
import typer
from aiokafka import TopicPartition
from aiokafka.structs import ConsumerRecord, OffsetAndMetadata

from agents.cli.common import (
    Bootstrap,
    app,
    consumer_for,
    fail,
    fmt_time,
    partitions_of,
    preview,
    read_between,
    run,
    settings_for,
)
from agents.ingest.producer import ActionsProducer
from schemas import (
    DeadLetter,
    InvalidMessage,
    SessionLink,
    context_operation_adapter,
    decode,
)
from schemas.connector import parse_actions
from streams.settings import Settings
from streams.topics import ACTIONS, DEAD_LETTERS, ensure_topics, redrive_topic

#: Dead-letter stages whose original bytes are an actions payload (re-drivable).
ACTIONS_STAGES = ("accumulate", "ingest", "sse", "produce-file")
#: ``sink-<name>``: a sink refused the original (an operation or link); it goes back to it.
SINK_STAGE = "sink-"

dead_letters_app = typer.Typer(
    help="Inspect dead letters and re-drive the ones that now parse.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(dead_letters_app, name="dead-letters")
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
                lambda raw: parse_actions(raw).session_id,
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
