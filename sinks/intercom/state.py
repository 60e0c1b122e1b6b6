"""The Intercom sink's bookkeeping per session, kept in ``context.extra``.

``conversation_id``, ``notes`` (unredacted notes with part id and range),
``posted_to`` (highest action at the destination), ``pending_summary`` and
``to_redact`` (progress of a summary), ``rev``; persisted by the runner with the
session's context.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field

from sinks.context import SessionContext
from sinks.intercom.notes import Kind, parse_note

__all__ = [
    "IntercomState",
    "Note",
    "PendingSummary",
    "Redaction",
    "follow_link",
    "load",
    "rebuild",
    "retire_covered",
    "store",
]

log = logging.getLogger(__name__)


class Note(BaseModel):
    part_id: str
    conversation_id: str
    kind: Kind
    seq_from: int
    seq_to: int


class Redaction(BaseModel):
    part_id: str
    conversation_id: str


class PendingSummary(BaseModel):
    seq_to: int
    part_id: str | None = None


class IntercomState(BaseModel):
    """What ``context.extra`` holds for this sink (JSON, persisted with the context)."""

    conversation_id: str | None = None  # where the notes live now
    op_conversation_id: str | None = None  # last one carried by an operation (wins)
    link_conversation_id: str | None = None  # from the links topic
    generation: int = 0
    posted_to: int = 0  # highest action sequence number present at the destination
    summary_to: int = 0  # the range of the latest summary there (in a summary or catch-up note)
    notes: list[Note] = Field(default_factory=list)  # unredacted notes, in posting order
    pending_summary: PendingSummary | None = None
    to_redact: list[Redaction] = Field(default_factory=list)
    rev: int = 0  # bumped on every completed apply/link
    # An operation was refused because the conversation did not exist: ``posted_to``
    # overstates what is there, so the next touch rebuilds it from the conversation.
    missing: bool = False
    # The previous generation's notes still up: its late final summary retires them.
    previous_generation: int | None = None
    previous_notes: list[Note] = Field(default_factory=list)


def load(context: SessionContext) -> IntercomState:
    state = IntercomState.model_validate(context.extra) if context.extra else IntercomState()
    if state.generation != context.generation:
        # The session came back after it expired: a new incarnation numbered from 1.
        # Its notes so far stay in the conversation; until the old generation's final
        # summary is up (it may still be in the LLM) they are remembered, so that
        # summary can retire them (tests/integration/test_intercom.py: ..._late_final_summary...).
        state = state.model_copy(
            update={
                "generation": context.generation,
                "posted_to": 0,
                "summary_to": 0,
                "notes": [],
                "pending_summary": None,
                "previous_generation": state.generation,
                "previous_notes": state.notes,
            }
        )
    return state


def store(context: SessionContext, state: IntercomState) -> None:
    context.extra.clear()
    context.extra.update(state.model_dump(mode="json"))


def follow_link(state: IntercomState, session_id: str) -> None:
    """An operation's ``conversation_id`` wins; otherwise the links topic's."""
    target = state.op_conversation_id or state.link_conversation_id
    if target is None or target == state.conversation_id:
        return
    if state.conversation_id is not None:
        log.info(
            "session %s moves from conversation %s to %s; its notes there stay",
            session_id,
            state.conversation_id,
            target,
        )
    state.conversation_id = target
    state.notes = []
    state.posted_to = state.summary_to = 0
    state.pending_summary = None


def retire_covered(state: IntercomState, seq_to: int, *, keep: str | None) -> None:
    """Move every note whose range ``seq_to`` covers (but ``keep``) to ``to_redact``."""
    covered = [n for n in state.notes if n.seq_to <= seq_to and n.part_id != keep]
    if not covered:
        return
    gone = {n.part_id for n in covered}
    state.notes = [n for n in state.notes if n.part_id not in gone]
    queued = {r.part_id for r in state.to_redact}
    state.to_redact.extend(
        Redaction(part_id=n.part_id, conversation_id=n.conversation_id)
        for n in covered
        if n.part_id not in queued
    )


def rebuild(
    state: IntercomState, parts: list[dict[str, Any]], *, complete: bool, ref: str, generation: int
) -> tuple[int, int]:
    """Rebuild ``state`` from the parts of its conversation: our notes there win over our
    copy. Returns how many notes we had no record of, and how many duplicates."""
    conversation_id = state.conversation_id
    assert conversation_id is not None
    found: list[Note] = []
    duplicates: list[Note] = []
    seen: set[tuple[str, int, int]] = set()
    for part in parts:
        if part.get("part_type") != "note" or part.get("redacted"):
            continue
        marker = parse_note(part.get("body"))
        if marker is None or marker.ref != ref or marker.generation != generation:
            continue
        note = Note(
            part_id=str(part.get("id")),
            conversation_id=conversation_id,
            kind=marker.kind,
            seq_from=marker.seq_from,
            seq_to=marker.seq_to,
        )
        identity = (note.kind, note.seq_from, note.seq_to)
        (duplicates if identity in seen else found).append(note)
        seen.add(identity)
    found_ids = {n.part_id for n in found}
    elsewhere = [n for n in state.notes if n.conversation_id != conversation_id]
    unseen = (
        []
        if complete
        else [
            n
            for n in state.notes
            if n.conversation_id == conversation_id and n.part_id not in found_ids
        ]
    )
    before = {n.part_id for n in state.notes}
    state.notes = elsewhere + unseen + found
    # Once the conversation was missing, only its notes say what reached it.
    known = 0 if state.missing else state.posted_to
    state.posted_to = max([known, *(n.seq_to for n in state.notes)])
    if state.missing:
        tops = [n.seq_to for n in state.notes if n.kind == "summary"]
        state.summary_to = max(tops, default=0)
    state.missing = False
    for dup in duplicates:  # e.g. from a worker that lost its partition mid-post
        state.to_redact.append(Redaction(part_id=dup.part_id, conversation_id=conversation_id))
    # A summary note that is there covers every older note, whatever our copy says.
    summaries = [n for n in state.notes if n.kind == "summary"]
    if summaries:
        top = max(summaries, key=lambda n: n.seq_to)
        retire_covered(state, top.seq_to, keep=top.part_id)
        pending = state.pending_summary
        if pending is not None and pending.part_id is None and pending.seq_to == top.seq_to:
            pending.part_id = top.part_id
    return len(found_ids - before), len(duplicates)
