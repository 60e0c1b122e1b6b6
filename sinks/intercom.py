"""Intercom sink: each batch an internal admin note; each summary a note that replaces them.

What the SDK's Intercom example gets wrong, and what this sink does instead:

- Redacting by position (``part_ids.pop``) removed notes posted while the LLM was
  busy: every note is recorded with the sequence range it holds, and a summary
  redacts exactly the notes whose range it covers plus the previous summary note.
- Best-effort redaction: redactions are retried until done (a part already
  redacted or gone counts as done); the summary is posted and confirmed first,
  so the conversation never has a context gap.
- Pre-link buffers in memory were lost or reordered: actions before the link
  are in the session's durable context, and the link (``links`` topic, or a
  ``conversation_id`` on an operation) posts *one* note with everything waiting;
  the runner's per-session lane keeps links in order with operations.
- Re-posts and posts whose id was lost: each note carries a marker (session,
  generation, kind, range); after a restart or an attempt of unknown outcome the
  sink reads the conversation once and rebuilds its bookkeeping from the notes
  there, so a note is never posted twice.
- Notes go in sequence order, one operation at a time per session, and a
  summary note always before its redactions.

Bookkeeping lives in ``context.extra`` (persisted by the runner with the
session's context): ``conversation_id``, ``notes`` (unredacted notes with part id
and range), ``posted_to`` (highest action at the destination),
``pending_summary`` and ``to_redact`` (progress of a summary), ``rev``.
"""

from __future__ import annotations

import asyncio
import hashlib
import html
import logging
import re
import time
from collections import OrderedDict
from collections.abc import Generator
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn

import httpx
from pydantic import BaseModel, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import SummaryReady
from schemas.text import one_line, printable
from sinks.base import Operation, PermanentSinkError
from sinks.context import SessionContext, summary_block
from sinks.http_retry import (
    RateLimitGate,
    TransientHTTPError,
    describe,
    quiet_httpx_logging,
    scrub,
    send,
)
from streams.errors import AgentContextError
from streams.settings import HttpURL, Settings, from_environment

__all__ = [
    "IntercomAPI",
    "IntercomSettings",
    "IntercomSink",
    "NoteMarker",
    "note_body",
    "parse_note",
]

log = logging.getLogger(__name__)

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
_TRUSTED_MAX = 100_000


# --------------------------------------------------------------------------- settings


class IntercomSettings(BaseSettings):
    """``AC_INTERCOM_*``: read only when the Intercom sink is used."""

    model_config = SettingsConfigDict(env_prefix="AC_INTERCOM_", extra="ignore")

    token: SecretStr
    admin_id: str = Field(min_length=1)
    api_base: HttpURL = "https://api.intercom.io"
    version: str = "2.11"
    timeout_s: float = Field(default=10.0, gt=0)
    max_concurrency: int = Field(default=8, ge=1)
    attempts: int = Field(default=4, ge=1)  # fast tries in the sink before the runner's backoff
    not_found_grace_s: float = Field(default=300.0, ge=0)

    @field_validator("token")
    @classmethod
    def _token_not_blank(cls, value: SecretStr) -> SecretStr:
        if not value.get_secret_value().strip():
            raise ValueError("must not be empty")
        return value

    @classmethod
    def load(cls) -> IntercomSettings:
        return from_environment(cls, "AC_INTERCOM_")


# --------------------------------------------------------------------------- note bodies


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


# --------------------------------------------------------------------------- HTTP client


class ConversationNotFound(AgentContextError):
    def __init__(self, conversation_id: str) -> None:
        super().__init__(f"Intercom conversation {conversation_id} not found")
        self.conversation_id = conversation_id


class ConversationMissing(PermanentSinkError):
    """Refused because the conversation is still not there after the grace period."""


class _BearerAuth(httpx.Auth):
    """Adds the token per request, so it is in no client default, repr or error text."""

    def __init__(self, token: SecretStr) -> None:
        self._token = token

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["Authorization"] = f"Bearer {self._token.get_secret_value()}"
        yield request

    def __repr__(self) -> str:
        return "<BearerAuth ***>"


class IntercomAPI:
    """The three calls the sink needs, with Intercom's status codes interpreted."""

    def __init__(
        self, settings: IntercomSettings, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.settings = settings
        self._secrets = (settings.token.get_secret_value(),)
        self._client = httpx.AsyncClient(
            base_url=settings.api_base.rstrip("/"),
            auth=_BearerAuth(settings.token),
            headers={
                "Accept": "application/json",
                "Intercom-Version": settings.version,
                "User-Agent": "agent-context-streams",
            },
            timeout=settings.timeout_s,
            limits=httpx.Limits(max_connections=settings.max_concurrency * 2),
            transport=transport,
        )
        self.gate = RateLimitGate()
        self._slots: asyncio.Semaphore | None = None

    def __repr__(self) -> str:
        return f"<IntercomAPI {self.settings.api_base} admin={self.settings.admin_id}>"

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _send(self, method: str, path: str, *, idempotent: bool, **kw: Any) -> httpx.Response:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.settings.max_concurrency)
        async with self._slots:
            return await send(
                self._client,
                method,
                path,
                gate=self.gate,
                idempotent=idempotent,
                attempts=self.settings.attempts,
                secrets=self._secrets,
                label="Intercom ",
                **kw,
            )

    def _unexpected(self, method: str, path: str, response: httpx.Response) -> Exception:
        text = scrub(f"Intercom {describe(method, path, response)}", self._secrets)
        if response.status_code == 401:
            # A revoked or wrong token is an outage to fix, not a verdict on this
            # operation: keep it (the lane waits, retried with backoff) and say so.
            log.error("%s: check AC_INTERCOM_TOKEN", text)
            return TransientHTTPError(text, status=401)
        return PermanentSinkError(text)

    async def reply_note(self, conversation_id: str, body: str) -> list[dict[str, Any]]:
        """Post an admin note; returns the conversation's parts (the new one is last)."""
        path = f"/conversations/{conversation_id}/reply"
        payload = {
            "message_type": "note",
            "type": "admin",
            "admin_id": self.settings.admin_id,
            "body": body,
        }
        response = await self._send("POST", path, idempotent=False, json=payload)
        if response.status_code == 404:
            raise ConversationNotFound(conversation_id)
        if not response.is_success:
            raise self._unexpected("POST", path, response)
        return _parts(response)

    async def redact(self, conversation_id: str, part_id: str) -> bool:
        """Redact a part; True when done (including already redacted or gone)."""
        path = "/conversations/redact"
        payload = {
            "type": "conversation_part",
            "conversation_id": conversation_id,
            "conversation_part_id": part_id,
        }
        response = await self._send("POST", path, idempotent=True, json=payload)
        if response.is_success or response.status_code == 404:
            return True
        if response.status_code in (400, 422) and "not_redactable" in response.text:
            return True  # our notes always have a body: this one is redacted already
        error = self._unexpected("POST", path, response)
        if isinstance(error, TransientHTTPError):
            raise error
        log.error("%s: part %s stays visible", error, part_id)
        return False

    async def conversation(self, conversation_id: str) -> tuple[list[dict[str, Any]], bool]:
        """The conversation's parts, and whether they are all of them (max 500)."""
        path = f"/conversations/{conversation_id}"
        response = await self._send("GET", path, idempotent=True)
        if response.status_code == 404:
            raise ConversationNotFound(conversation_id)
        if not response.is_success:
            raise self._unexpected("GET", path, response)
        parts = _parts(response)
        try:
            total = int(response.json()["conversation_parts"].get("total_count", len(parts)))
        except (KeyError, TypeError, ValueError, AttributeError):
            total = len(parts)
        return parts, total <= len(parts)


def _parts(response: httpx.Response) -> list[dict[str, Any]]:
    try:
        parts = response.json()["conversation_parts"]["conversation_parts"]
    except (KeyError, TypeError, ValueError):
        return []
    return [p for p in parts if isinstance(p, dict)] if isinstance(parts, list) else []


# --------------------------------------------------------------------------- bookkeeping


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


def _load(context: SessionContext) -> IntercomState:
    state = IntercomState.model_validate(context.extra) if context.extra else IntercomState()
    if state.generation != context.generation:
        # The session came back after it expired: a new incarnation numbered from 1.
        # Its notes so far stay in the conversation; until the old generation's final
        # summary is up (it may still be in the LLM) they are remembered, so that
        # summary can retire them (tests/test_intercom.py: ..._late_final_summary...).
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


def _store(context: SessionContext, state: IntercomState) -> None:
    context.extra.clear()
    context.extra.update(state.model_dump(mode="json"))


# --------------------------------------------------------------------------- the sink


class IntercomSink:
    """A :class:`~sinks.base.LinkAwareSink` that keeps a conversation's notes bounded."""

    name = "intercom"

    def __init__(self, api: IntercomAPI) -> None:
        self.api = api
        # Sessions whose bookkeeping this process left, with the ``rev`` it left:
        # a context that doesn't match (a restart, a rebalance) is reconciled once.
        self._trusted: OrderedDict[str, tuple[str, int]] = OrderedDict()
        # Sessions whose last attempt may have posted without us knowing the id.
        self._dirty: set[str] = set()
        self._missing_since: dict[str, float] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> IntercomSink:
        quiet_httpx_logging()
        return cls(IntercomAPI(IntercomSettings.load()))

    def __repr__(self) -> str:
        return f"<IntercomSink {self.api!r}>"

    # -- the protocol --------------------------------------------------------

    async def apply(self, op: Operation, context: SessionContext) -> None:
        state = _load(context)
        try:
            if op.conversation_id:
                state.op_conversation_id = op.conversation_id
            self._follow_link(context.session_id, state)
            if state.conversation_id is not None and op.generation != context.generation:
                if isinstance(op, SummaryReady):
                    await self._apply_previous_summary(context, state, op)
            elif state.conversation_id is not None:
                await self._catch_up(context, state)
                # A summary already there (a re-drive, after a catch-up note held it) is
                # not posted again; what the context holds beyond it goes up below.
                if isinstance(op, SummaryReady) and op.seq_to > state.summary_to:
                    await self._apply_summary(context, state, op)
                await self._post_waiting(context, state, when=op.emitted_at)
            self._done(context.session_id, state, synced=True)
        except PermanentSinkError as exc:
            state.missing = state.missing or isinstance(exc, ConversationMissing)
            self._done(context.session_id, state, synced=False)
            raise
        finally:
            _store(context, state)

    async def link(self, session_id: str, conversation_id: str, context: SessionContext) -> None:
        state = _load(context)
        try:
            state.link_conversation_id = conversation_id
            self._follow_link(session_id, state)
            if state.conversation_id is not None:
                await self._catch_up(context, state)
                await self._post_waiting(context, state, when=time.time())
            self._done(session_id, state, synced=True)
        except PermanentSinkError as exc:
            state.missing = state.missing or isinstance(exc, ConversationMissing)
            self._done(session_id, state, synced=False)
            raise
        finally:
            _store(context, state)

    async def aclose(self) -> None:
        await self.api.aclose()

    async def erase(self, session_id: str, context: SessionContext) -> None:
        """Redact every note this sink posted for the session, in every generation: the
        conversation itself is read for them, not only our bookkeeping."""
        state = _load(context)
        ref = session_ref(session_id)
        targets = {(n.conversation_id, n.part_id) for n in state.notes + state.previous_notes}
        targets |= {(r.conversation_id, r.part_id) for r in state.to_redact}
        if state.conversation_id is not None:
            try:
                parts, _ = await self.api.conversation(state.conversation_id)
            except ConversationNotFound:
                parts = []  # gone already: nothing of the session left there
            for part in parts:
                marker = parse_note(part.get("body"))
                if marker is not None and marker.ref == ref and not part.get("redacted"):
                    targets.add((state.conversation_id, str(part.get("id"))))
        state.to_redact = [Redaction(part_id=p, conversation_id=c) for c, p in sorted(targets)]
        state.notes, state.previous_notes = [], []
        try:
            await self._redact_pending(state)
        finally:
            _store(context, state)  # what is left is retried with the erasure

    # -- steps ------------------------------------------------------------------

    def _follow_link(self, session_id: str, state: IntercomState) -> None:
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

    def _done(self, session_id: str, state: IntercomState, *, synced: bool) -> None:
        """Bump ``rev``; remember it if our bookkeeping matches the conversation."""
        state.rev += 1
        if not synced or state.conversation_id is None:
            # Never trusted unlinked: a link replayed after a crash must look first.
            self._trusted.pop(session_id, None)
            return
        self._trust(session_id, state)

    def _trust(self, session_id: str, state: IntercomState) -> None:
        assert state.conversation_id is not None
        self._trusted[session_id] = (state.conversation_id, state.rev)
        self._trusted.move_to_end(session_id)
        while len(self._trusted) > _TRUSTED_MAX:
            self._trusted.popitem(last=False)

    async def _catch_up(self, context: SessionContext, state: IntercomState) -> None:
        """Reconcile if our bookkeeping may be stale; finish redactions left over."""
        sid = context.session_id
        stale = self._trusted.get(sid) != (state.conversation_id, state.rev)
        if sid in self._dirty or stale or state.missing:
            await self._reconcile(context, state)
        await self._redact_pending(state)

    async def _apply_summary(
        self, context: SessionContext, state: IntercomState, op: SummaryReady
    ) -> None:
        pending = state.pending_summary
        if pending is None or pending.seq_to != op.seq_to:
            pending = state.pending_summary = PendingSummary(seq_to=op.seq_to)
        if pending.part_id is None:
            note = await self._post(
                context, state, "summary", 1, op.seq_to, _summary_text(op), when=op.emitted_at
            )
            pending.part_id = note.part_id
        # The summary note is confirmed: only now does anything it covers go.
        self._retire_covered(state, op.seq_to, keep=pending.part_id)
        await self._redact_pending(state)
        state.pending_summary = None
        state.summary_to = max(state.summary_to, op.seq_to)

    async def _apply_previous_summary(
        self, context: SessionContext, state: IntercomState, op: SummaryReady
    ) -> None:
        """The previous generation's late summary: post it, then retire what it covers."""
        if op.generation != state.previous_generation:
            return  # its notes are not ours to retire (an older generation, or unlinked)
        notes = state.previous_notes
        note = next(
            (n for n in notes if (n.kind, n.seq_from, n.seq_to) == ("summary", 1, op.seq_to)),
            None,
        )
        if note is None:
            sid = context.session_id
            body = note_body(
                sid, op.generation, "summary", 1, op.seq_to, _summary_text(op), op.emitted_at
            )
            part_id = await self._post_note(state, sid, body, ("summary", 1, op.seq_to))
            assert state.conversation_id is not None
            note = Note(
                part_id=part_id,
                conversation_id=state.conversation_id,
                kind="summary",
                seq_from=1,
                seq_to=op.seq_to,
            )
            notes.append(note)
        covered = [n for n in notes if n.seq_to <= op.seq_to and n.part_id != note.part_id]
        state.previous_notes = [n for n in notes if n not in covered]
        state.to_redact.extend(
            Redaction(part_id=n.part_id, conversation_id=n.conversation_id) for n in covered
        )
        await self._redact_pending(state)

    async def _post_waiting(
        self, context: SessionContext, state: IntercomState, when: float
    ) -> None:
        """Post what the context holds beyond ``posted_to``: one note, in sequence order."""
        batches = [b for b in context.batches if b.seq_to > state.posted_to]
        summary_waiting = context.summary is not None and context.summary_to > state.posted_to
        if not batches and not summary_waiting:
            return
        texts = [b.text for b in batches]
        if summary_waiting:
            assert context.summary is not None
            texts.insert(
                0,
                summary_block(context.summary, context.summary_to, context.ledger, context.closed),
            )
            kind: Kind = "catch-up" if batches else "summary"
            seq_from = 1
        else:
            kind, seq_from = "actions", batches[0].seq_from
        seq_to = batches[-1].seq_to if batches else context.summary_to
        await self._post(context, state, kind, seq_from, seq_to, "\n\n".join(texts), when=when)
        if summary_waiting:
            state.summary_to = max(state.summary_to, context.summary_to)

    # -- destination calls ---------------------------------------------------------

    async def _post(
        self,
        context: SessionContext,
        state: IntercomState,
        kind: Kind,
        seq_from: int,
        seq_to: int,
        text: str,
        *,
        when: float,
    ) -> Note:
        """Post a note unless the same note (kind and range) is there already."""
        for note in state.notes:
            if (note.kind, note.seq_from, note.seq_to) == (kind, seq_from, seq_to):
                return note
        conversation_id = state.conversation_id
        assert conversation_id is not None
        sid = context.session_id
        try:
            body = note_body(sid, context.generation, kind, seq_from, seq_to, text, when)
            part_id = await self._post_note(state, sid, body, (kind, seq_from, seq_to))
        except PermanentSinkError:
            state.posted_to = max(
                state.posted_to, seq_to
            )  # refused: don't resend it inside later notes
            raise
        note = Note(
            part_id=part_id,
            conversation_id=conversation_id,
            kind=kind,
            seq_from=seq_from,
            seq_to=seq_to,
        )
        state.notes.append(note)
        state.posted_to = max(state.posted_to, seq_to)
        return note

    async def _post_note(
        self, state: IntercomState, sid: str, body: str, identity: tuple[Kind, int, int]
    ) -> str:
        """Post one note (``body``, from :func:`note_body`) to the session's conversation;
        its part id, found by ``identity`` (kind, seq_from, seq_to) in the answer."""
        conversation_id = state.conversation_id
        assert conversation_id is not None
        try:
            parts = await self.api.reply_note(conversation_id, body)
        except TransientHTTPError as exc:
            if exc.maybe_delivered:
                self._dirty.add(sid)  # the next attempt looks before it posts again
            raise
        except ConversationNotFound:
            self._not_found(conversation_id)
        self._missing_since.pop(conversation_id, None)
        part_id = _new_part_id(parts, session_ref(sid), *identity)
        if part_id is None:
            # Posted, but the answer doesn't say which part it is: look it up next time.
            self._dirty.add(sid)
            raise TransientHTTPError(
                f"Intercom reply to {conversation_id}: no new note in the response",
                maybe_delivered=True,
            )
        return part_id

    def _not_found(self, conversation_id: str) -> NoReturn:
        """A conversation may not be visible yet right after it was created: retry for a while."""
        first = self._missing_since.setdefault(conversation_id, time.monotonic())
        if time.monotonic() - first < self.api.settings.not_found_grace_s:
            raise TransientHTTPError(f"Intercom conversation {conversation_id} not found (yet)")
        raise ConversationMissing(f"Intercom conversation {conversation_id} not found")

    @staticmethod
    def _retire_covered(state: IntercomState, seq_to: int, *, keep: str | None) -> None:
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

    async def _redact_pending(self, state: IntercomState) -> None:
        if not state.to_redact:
            return
        items = list(state.to_redact)
        results = await asyncio.gather(
            *(self.api.redact(r.conversation_id, r.part_id) for r in items),
            return_exceptions=True,
        )
        settled = {
            item.part_id
            for item, result in zip(items, results, strict=True)
            if not isinstance(result, BaseException)
        }
        state.to_redact = [r for r in state.to_redact if r.part_id not in settled]
        for result in results:
            if isinstance(result, BaseException):
                raise result  # what is left stays in to_redact for the retry

    async def _reconcile(self, context: SessionContext, state: IntercomState) -> None:
        """Rebuild the bookkeeping from the conversation itself (one GET)."""
        sid = context.session_id
        conversation_id = state.conversation_id
        assert conversation_id is not None
        try:
            parts, complete = await self.api.conversation(conversation_id)
        except ConversationNotFound:
            self._not_found(conversation_id)
        self._missing_since.pop(conversation_id, None)
        ref, generation = session_ref(sid), context.generation
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
            self._retire_covered(state, top.seq_to, keep=top.part_id)
            pending = state.pending_summary
            if pending is not None and pending.part_id is None and pending.seq_to == top.seq_to:
                pending.part_id = top.part_id
        adopted = found_ids - before
        if adopted or duplicates:
            log.info(
                "session %s: conversation %s had %d note(s) we had no record of, %d duplicate(s)",
                sid,
                conversation_id,
                len(adopted),
                len(duplicates),
            )
        self._dirty.discard(sid)
        self._trust(sid, state)


def _summary_text(op: SummaryReady) -> str:
    """A summary note's text: the summary, then the session's facts (the ledger)."""
    return f"{op.summary}\n\n{op.ledger.render()}" if op.ledger is not None else op.summary


def _new_part_id(
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
