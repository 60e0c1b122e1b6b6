"""The notes the Intercom sink posts: their HTML body and the marker that identifies them."""

from __future__ import annotations

import hashlib
import html
import re
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel

from schemas import SummaryReady
from schemas.text import one_line, printable

__all__ = [
    "Kind",
    "NoteMarker",
    "html_to_text",
    "new_part_id",
    "note_body",
    "parse_note",
    "session_ref",
    "summary_text",
]

Kind = Literal["actions", "summary", "catch-up"]
_LABELS: dict[str, str] = {
    "actions": "actions",
    "summary": "summary of actions",
    "catch-up": "catch-up of actions",
}
_KINDS = {label: kind for kind, label in _LABELS.items()}
_MARKER = re.compile(
    r"context: (actions|summary of actions|catch-up of actions) (\d+)-(\d+) "
    r"\[ac:([0-9a-f]{12}):g(\d+)\]"
)


class NoteMarker(BaseModel):
    kind: Kind
    seq_from: int
    seq_to: int
    ref: str  # sha256(session_id)[:12]
    generation: int


def session_ref(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()[:12]


def note_body(
    session_id: str,
    generation: int,
    kind: Kind,
    seq_from: int,
    seq_to: int,
    text: str,
    when: float,
) -> str:
    """The note's HTML: a header (session, UTC time, marker line), then the text.

    Intercom note bodies are HTML: the text is escaped, blank lines become
    paragraphs and single newlines ``<br>``.
    """
    stamp = datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    marker = f"[ac:{session_ref(session_id)}:g{generation}]"
    header = [
        f"session_id: {one_line(session_id)}",
        f"timestamp: {stamp}",
        f"context: {_LABELS[kind]} {seq_from}-{seq_to} {marker}",
    ]
    parts = ["<p>" + "<br>".join(html.escape(line) for line in header) + "</p>"]
    for paragraph in re.split(r"\n[ \t]*\n", printable(text).strip()):
        if paragraph.strip():
            lines = [html.escape(line) for line in paragraph.strip("\n").split("\n")]
            parts.append("<p>" + "<br>".join(lines) + "</p>")
    return "".join(parts)


def html_to_text(body: str) -> str:
    text = re.sub(r"<br\s*/?>|</p>|</div>|</li>", "\n", body, flags=re.I)
    return html.unescape(re.sub(r"<[^>]+>", "", text))


def parse_note(body: str | None) -> NoteMarker | None:
    """The marker of a note this sink posted, or None for anything else."""
    if not body or "[ac:" not in body:
        return None
    match = _MARKER.search(html_to_text(body))
    if match is None:
        return None
    label, seq_from, seq_to, ref, generation = match.groups()
    return NoteMarker(
        kind=_KINDS[label],  # type: ignore[arg-type]
        seq_from=int(seq_from),
        seq_to=int(seq_to),
        ref=ref,
        generation=int(generation),
    )


def summary_text(op: SummaryReady) -> str:
    """A summary note's text: the summary, then the session's facts (the ledger)."""
    return f"{op.summary}\n\n{op.ledger.render()}" if op.ledger is not None else op.summary


def new_part_id(
    parts: list[dict[str, Any]], ref: str, kind: Kind, seq_from: int, seq_to: int
) -> str | None:
    """The part just posted: the last note with our marker (Intercom appends it last)."""
    for part in reversed(parts):
        marker = parse_note(part.get("body"))
        if (
            marker is not None
            and marker.ref == ref
            and (marker.kind, marker.seq_from, marker.seq_to) == (kind, seq_from, seq_to)
        ):
            return str(part["id"])
    if parts and parts[-1].get("id") is not None and parts[-1].get("part_type") == "note":
        return str(parts[-1]["id"])
    return None
