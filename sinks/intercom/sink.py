"""The Intercom sink: notes in sequence order, a summary note replacing what it covers.

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
  there (:mod:`sinks.intercom.state`), so a note is never posted twice.
- Notes go in sequence order, one operation at a time per session, and a
  summary note always before its redactions.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

from schemas import SummaryReady
from sinks._http import TransientHTTPError
from sinks.base import Operation, PermanentSinkError, Sink
from sinks.context import SessionContext, summary_block
from sinks.intercom.api import ConversationMissing, ConversationNotFound, IntercomAPI
from sinks.intercom.notes import Kind, new_part_id, note_body, parse_note, session_ref, summary_text
from sinks.intercom.settings import IntercomSettings
from sinks.intercom.state import (
    IntercomState,
    Note,
    PendingSummary,
    Redaction,
    follow_link,
    load,
    rebuild,
    retire_covered,
    store,
)
from streams.settings import Settings

__all__ = ["IntercomSink"]

log = logging.getLogger(__name__)

_TRUSTED_MAX = 100_000


class IntercomSink(Sink):
    """A :class:`~sinks.base.LinkAwareSink` that keeps a conversation's notes bounded."""

    name = "intercom"
    reads_payload = False  # notes hold the context's text

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
        return cls(IntercomAPI(IntercomSettings.load()))

    def __repr__(self) -> str:
        return f"<IntercomSink {self.api!r}>"

    async def apply(self, op: Operation, context: SessionContext) -> None:
        with self._bookkeeping(context) as state:
            if op.conversation_id:
                state.op_conversation_id = op.conversation_id
            follow_link(state, context.session_id)
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

    async def link(self, session_id: str, conversation_id: str, context: SessionContext) -> None:
        with self._bookkeeping(context) as state:
            state.link_conversation_id = conversation_id
            follow_link(state, session_id)
            if state.conversation_id is not None:
                await self._catch_up(context, state)
                await self._post_waiting(context, state, when=time.time())

    async def aclose(self) -> None:
        await self.api.aclose()

    async def erase(self, session_id: str, context: SessionContext) -> None:
        """Redact every note this sink posted for the session, in every generation: the
        conversation itself is read for them, not only our bookkeeping."""
        state = load(context)
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
            store(context, state)  # what is left is retried with the erasure

    @contextmanager
    def _bookkeeping(self, context: SessionContext) -> Iterator[IntercomState]:
        """The session's state for one apply or link, stored back whatever happens."""
        state = load(context)
        try:
            yield state
            self._done(context.session_id, state, synced=True)
        except PermanentSinkError as exc:
            state.missing = state.missing or isinstance(exc, ConversationMissing)
            self._done(context.session_id, state, synced=False)
            raise
        finally:
            store(context, state)

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
                context, state, "summary", 1, op.seq_to, summary_text(op), when=op.emitted_at
            )
            pending.part_id = note.part_id
        # The summary note is confirmed: only now does anything it covers go.
        retire_covered(state, op.seq_to, keep=pending.part_id)
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
            identity: tuple[Kind, int, int] = ("summary", 1, op.seq_to)
            sid, text = context.session_id, summary_text(op)
            note = await self._post_note(state, sid, op.generation, identity, text, op.emitted_at)
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
        identity: tuple[Kind, int, int] = (kind, seq_from, seq_to)
        try:
            note = await self._post_note(
                state, context.session_id, context.generation, identity, text, when
            )
        except PermanentSinkError:
            state.posted_to = max(state.posted_to, seq_to)  # refused: not resent in later notes
            raise
        state.notes.append(note)
        state.posted_to = max(state.posted_to, seq_to)
        return note

    async def _post_note(
        self,
        state: IntercomState,
        sid: str,
        generation: int,
        identity: tuple[Kind, int, int],
        text: str,
        when: float,
    ) -> Note:
        """Post one note (its body from :func:`note_body`) to the session's conversation;
        its part id is found by ``identity`` (kind, seq_from, seq_to) in the answer."""
        conversation_id = state.conversation_id
        assert conversation_id is not None
        body = note_body(sid, generation, *identity, text, when)
        try:
            parts = await self.api.reply_note(conversation_id, body)
        except TransientHTTPError as exc:
            if exc.maybe_delivered:
                self._dirty.add(sid)  # the next attempt looks before it posts again
            raise
        except ConversationNotFound:
            self._not_found(conversation_id)
        self._missing_since.pop(conversation_id, None)
        part_id = new_part_id(parts, session_ref(sid), *identity)
        if part_id is None:
            # Posted, but the answer doesn't say which part it is: look it up next time.
            self._dirty.add(sid)
            raise TransientHTTPError(
                f"Intercom reply to {conversation_id}: no new note in the response",
                maybe_delivered=True,
            )
        kind, seq_from, seq_to = identity
        return Note(
            part_id=part_id,
            conversation_id=conversation_id,
            kind=kind,
            seq_from=seq_from,
            seq_to=seq_to,
        )

    def _not_found(self, conversation_id: str) -> NoReturn:
        """A conversation may not be visible yet right after it was created: retry for a while."""
        first = self._missing_since.setdefault(conversation_id, time.monotonic())
        if time.monotonic() - first < self.api.settings.not_found_grace_s:
            raise TransientHTTPError(f"Intercom conversation {conversation_id} not found (yet)")
        raise ConversationMissing(f"Intercom conversation {conversation_id} not found")

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
        adopted, duplicates = rebuild(
            state, parts, complete=complete, ref=ref, generation=generation
        )
        if adopted or duplicates:
            log.info(
                "session %s: conversation %s had %d note(s) we had no record of, %d duplicate(s)",
                sid,
                conversation_id,
                adopted,
                duplicates,
            )
        self._dirty.discard(sid)
        self._trust(sid, state)
