"""A sink's per-session view of the destination: what an agent reads now.

It is the rolling summary followed by the raw batches after the summary's
range, never a summarised action twice. Sinks persist it in their table, so a
restart neither re-applies nor forgets anything; ``extra`` is the sink's own
bookkeeping (e.g. which Intercom note holds which range).
"""

from __future__ import annotations

import copy
from typing import Any

import orjson
from pydantic import BaseModel, Field

from schemas import ActionsWritten, SummaryReady

__all__ = ["Batch", "SessionContext", "Skip"]


class Batch(BaseModel):
    seq_from: int
    seq_to: int
    text: str


class Skip(Exception):
    """The operation was applied before (a redelivery) or belongs to an older generation."""


class SessionContext(BaseModel):
    session_id: str
    generation: int = 0
    summary: str | None = None
    summary_to: int = 0  # the summary covers actions 1..summary_to
    actions_to: int = 0  # highest action sequence number applied
    batches: list[Batch] = Field(default_factory=list)
    closed: bool = False
    summaries: int = 0  # how many summaries this context has taken (for operators)
    extra: dict[str, Any] = Field(default_factory=dict)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionContext:
        return cls.model_validate(orjson.loads(raw))

    def advanced(self, op: ActionsWritten | SummaryReady) -> SessionContext:
        """The context after ``op``; raises :class:`Skip` if ``op`` was applied already."""
        if op.generation < self.generation:
            raise Skip(f"generation {op.generation} < {self.generation}")
        base = self
        if op.generation > self.generation:  # the session came back after it expired
            # ``extra`` is carried over: the sink decides what of its bookkeeping
            # outlives a generation (e.g. the session's Intercom conversation).
            base = SessionContext(
                session_id=self.session_id, generation=op.generation, extra=self.extra
            )
        if isinstance(op, ActionsWritten):
            if op.seq_to <= base.actions_to:
                raise Skip(f"actions up to {op.seq_to} applied already")
            batch = Batch(seq_from=op.seq_from, seq_to=op.seq_to, text=op.text)
            return base._copy(actions_to=op.seq_to, batches=[*base.batches, batch])
        if op.seq_to <= base.summary_to:
            raise Skip(f"summary up to {op.seq_to} applied already")
        return base._copy(
            summary=op.summary,
            summary_to=op.seq_to,
            # A batch that arrived while the LLM was busy is not covered: it stays.
            batches=[b for b in base.batches if b.seq_from > op.seq_to],
            closed=op.final,
            summaries=base.summaries + 1,
        )

    def _copy(self, **changes: Any) -> SessionContext:
        """A copy with ``changes``; the sink's ``extra`` is copied deep (a sink may change
        it), the batches are shared (never changed in place). Fix (found with py-spy on a
        backlog, where summaries trail their actions): a deep copy of the whole context
        made every operation O(window)."""
        extra = copy.deepcopy(self.extra) if self.extra else {}
        return self.model_copy(update={"extra": extra, **changes})

    def render(self) -> str:
        """The text an agent reads: the summary, then the raw batches after it."""
        parts = []
        if self.summary is not None:
            parts.append(f"Summary of actions 1-{self.summary_to}:\n{self.summary}")
        parts.extend(b.text for b in self.batches)
        return "\n\n".join(parts) + ("\n" if parts else "")
