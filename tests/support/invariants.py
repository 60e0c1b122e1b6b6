"""The delivery invariant, checked from the destination's own record.

Input truth is what the broker holds in ``actions`` (read back after the run).
From it follows, per session, exactly which raw batches a destination must get
(sequence ranges and text, oversized batches split at the per-batch limit) and
where the threshold crossings fall. Against that, a recorder's log of applied
operations is checked:

* every batch delivered exactly once *in effect*, in order, with its text;
* summaries rolling (``seq_from`` 1), windows contiguous, ranges exactly the
  threshold crossings (plus a final one for an idle-closed session);
* a summary applied only after every batch it covers (nothing summarised that
  was not delivered);
* the files sink's context = last summary + exactly the batches after it.

"Exactly once in effect": a sink applies an operation and then saves its
high-water mark; a kill between the two makes the runner apply it again after
restart. So the recorder, which appends on every ``apply``, can hold the same
operation twice: that is the at-least-once destination boundary, counted as
``reapplied`` (never a violation if identical) and reported. A re-application
that differs from the first, or any gap, reorder or extra, is a violation.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from schemas import ActionsPayload, InvalidMessage, decode
from schemas.ledger import SessionLedger
from sinks.context import summary_block
from sinks.files import context_file
from tests.support.kafka_io import Record

__all__ = ["Expected", "Report", "check_files", "check_records", "expected_from_topic"]


@dataclass(frozen=True)
class Batch:
    seq_from: int
    seq_to: int
    text: str


@dataclass
class SessionInput:
    session_id: str
    generation: int
    batches: list[Batch] = field(default_factory=list)
    crossings: list[int] = field(default_factory=list)  # seq_to of each threshold crossing
    pending: int = 0  # actions after the last crossing

    @property
    def total(self) -> int:
        return self.batches[-1].seq_to if self.batches else 0


@dataclass
class Expected:
    sessions: dict[str, SessionInput]
    invalid: list[tuple[Record, str]]  # must all be in dead letters

    @property
    def actions(self) -> int:
        return sum(s.total for s in self.sessions.values())


def _chunks(payload: ActionsPayload, size: int) -> list[ActionsPayload]:
    actions = payload.actions
    return [
        payload.model_copy(
            update={"actions": actions[i : i + size], "count": len(actions[i : i + size])}
        )
        for i in range(0, len(actions), size)
    ]


def expected_from_topic(records: list[Record], threshold: int, max_per_batch: int) -> Expected:
    sessions: dict[str, SessionInput] = {}
    invalid: list[tuple[Record, str]] = []
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        try:
            payload = decode(ActionsPayload, record.value)
        except InvalidMessage as exc:
            invalid.append((record, exc.reason))
            continue
        sid = payload.session_id
        session = sessions.setdefault(sid, SessionInput(sid, generation=record.offset))
        for chunk in _chunks(payload, max_per_batch):
            seq_from = session.total + 1
            seq_to = session.total + len(chunk.actions)
            session.batches.append(Batch(seq_from, seq_to, chunk.numbered_text(seq_from)))
            session.pending += len(chunk.actions)
            if session.pending >= threshold:
                session.crossings.append(seq_to)
                session.pending = 0
    return Expected(sessions, invalid)


@dataclass
class Report:
    violations: list[str] = field(default_factory=list)
    records: int = 0  # operations the recorder applied, re-applications included
    distinct: int = 0
    reapplied: int = 0  # identical re-applications after a sink crash (at-least-once boundary)
    sessions: int = 0
    batches: int = 0
    summaries: int = 0
    complete_sessions: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def line(self) -> str:
        return (
            f"{self.sessions} sessions, {self.distinct} distinct operations "
            f"({self.batches} batches, {self.summaries} summaries) from {self.records} "
            f"applications ({self.reapplied} identical re-applications after sink crashes), "
            f"{self.complete_sessions} sessions complete, {len(self.violations)} violations"
        )

    def add(self, message: str) -> None:
        if len(self.violations) < 200:
            self.violations.append(message)


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record["op"], record["generation"], record["seq_from"], record["seq_to"])


def _content(record: dict[str, Any]) -> Any:
    return record.get("text") if record["op"] == "actions_written" else record.get("summary")


def check_records(
    records: list[dict[str, Any]],
    expected: Expected,
    *,
    complete: bool = True,
    finals: bool = False,
) -> Report:
    """Check a recorder's log against the input. ``complete``: everything must have arrived.

    ``finals``: sessions were closed for idleness, so each ends with a final
    summary of what was below the threshold (when anything was).
    """
    report = Report(records=len(records))
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for record in records:
        by_session[str(record["session_id"])].append(record)
    for sid in sorted(set(by_session) - set(expected.sessions)):
        report.add(f"{sid}: operations for a session that is not in the input")
    for sid, session in expected.sessions.items():
        report.sessions += 1
        _check_session(report, session, by_session.get(sid, []), complete=complete, finals=finals)
    return report


def _check_session(
    report: Report,
    session: SessionInput,
    records: list[dict[str, Any]],
    *,
    complete: bool,
    finals: bool,
) -> None:
    sid = session.session_id
    seen: dict[tuple[Any, ...], dict[str, Any]] = {}
    distinct: list[dict[str, Any]] = []
    for record in records:
        if record["generation"] != session.generation:
            report.add(f"{sid}: generation {record['generation']} != {session.generation}")
            continue
        key = _key(record)
        if key in seen:
            if _content(seen[key]) != _content(record):
                report.add(f"{sid}: {key} applied twice with different content")
            report.reapplied += 1
            continue
        seen[key] = record
        distinct.append(record)
    report.distinct += len(distinct)

    writes = [r for r in distinct if r["op"] == "actions_written"]
    got = [(r["seq_from"], r["seq_to"]) for r in writes]
    want = [(b.seq_from, b.seq_to) for b in session.batches]
    report.batches += len(writes)
    if got != want[: len(got)]:
        first = next(
            (i for i, (g, w) in enumerate(zip(got, want, strict=False)) if g != w), len(want)
        )
        report.add(f"{sid}: batches {got[first : first + 3]} where {want[first : first + 3]} due")
    else:
        for record, batch in zip(writes, session.batches, strict=False):
            if record["text"] != batch.text:
                report.add(f"{sid}: batch {batch.seq_from}-{batch.seq_to} text differs")
                break
    if complete and len(got) < len(want):
        report.add(f"{sid}: {len(want) - len(got)} batches never delivered (from {want[len(got)]})")

    summaries = [r for r in distinct if r["op"] == "summary_ready"]
    report.summaries += len(summaries)
    ends = [s["seq_to"] for s in summaries]
    boundaries = {b.seq_to for b in session.batches}
    due = list(session.crossings)
    if finals and session.pending:
        due.append(session.total)
    if ends != due[: len(ends)] or (complete and len(ends) != len(due)):
        report.add(f"{sid}: summaries end at {ends}, expected {due}")
    for previous, summary in zip([None, *summaries], summaries, strict=False):
        if summary["seq_from"] != 1:
            report.add(f"{sid}: summary {summary['seq_to']} is not rolling (seq_from 1)")
        window = 1 if previous is None else previous["seq_to"] + 1
        if summary["window_from"] != window:
            report.add(f"{sid}: summary window starts at {summary['window_from']}, not {window}")
        if summary["seq_to"] not in boundaries:
            report.add(f"{sid}: summary ends at {summary['seq_to']}, inside a batch")
        if summary.get("final") and not finals:
            report.add(f"{sid}: unexpected final summary at {summary['seq_to']}")
    if finals and summaries and session.pending and not summaries[-1].get("final"):
        report.add(f"{sid}: the last summary is not final")
    # Nothing summarised that was not delivered first.
    delivered_to = 0
    for record in distinct:
        if record["op"] == "actions_written":
            delivered_to = record["seq_to"]
        elif record["seq_to"] > delivered_to:
            report.add(
                f"{sid}: summary to {record['seq_to']} before batch {delivered_to + 1} arrived"
            )
    if got == want and len(ends) == len(due):
        report.complete_sessions += 1


def is_complete(records: list[dict[str, Any]], expected: Expected, *, finals: bool = False) -> bool:
    """Cheap progress test: every session's last batch and last due summary arrived."""
    last_batch: dict[str, int] = defaultdict(int)
    last_summary: dict[str, int] = defaultdict(int)
    for r in records:
        target = last_batch if r["op"] == "actions_written" else last_summary
        target[str(r["session_id"])] = max(target[str(r["session_id"])], r["seq_to"])
    for sid, s in expected.sessions.items():
        due = s.total if finals and s.pending else (s.crossings[-1] if s.crossings else 0)
        if last_batch[sid] < s.total or last_summary[sid] < due:
            return False
    return True


def progress(records: list[dict[str, Any]], expected: Expected) -> str:
    last: dict[str, int] = defaultdict(int)
    for r in records:
        if r["op"] == "actions_written":
            last[str(r["session_id"])] = max(last[str(r["session_id"])], r["seq_to"])
    done = sum(1 for sid, s in expected.sessions.items() if last[sid] >= s.total)
    return f"{done}/{len(expected.sessions)} sessions fully delivered, {len(records)} records"


def summary_text(summary: dict[str, Any]) -> str:
    """A recorded ``summary_ready`` as the files sink renders it: range, text, ledger."""
    ledger = summary.get("ledger")
    return summary_block(
        summary["summary"],
        summary["seq_to"],
        msgspec.convert(ledger, SessionLedger) if ledger else None,
        bool(summary.get("final")),
    )


def expected_context(session: SessionInput, summary: dict[str, Any] | None) -> str:
    parts = []
    covered = 0
    if summary is not None:
        covered = summary["seq_to"]
        parts.append(summary_text(summary))
    parts.extend(b.text for b in session.batches if b.seq_from > covered)
    return "\n\n".join(parts) + ("\n" if parts else "")


def check_files(files_dir: Path, records: list[dict[str, Any]], expected: Expected) -> list[str]:
    """Sessions whose context file is not the last summary + exactly the batches after it.

    The last summary's text is taken from the recorder: both sinks apply the
    first operation the topic holds for a range and skip later ones.
    """
    last: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["op"] == "summary_ready":
            sid = str(r["session_id"])
            # >=: a final after a summary of the same range (an idle close) makes it final.
            if sid not in last or r["seq_to"] >= last[sid]["seq_to"]:
                last[sid] = r
    wrong = []
    for sid, session in expected.sessions.items():
        path = context_file(files_dir, sid)
        want = expected_context(session, last.get(sid))
        # Bytes, not read_text(): universal newlines would turn a "\r" in an action into "\n".
        if not path.exists() or path.read_bytes().decode("utf-8") != want:
            wrong.append(sid)
    return wrong
