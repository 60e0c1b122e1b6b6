"""A sink's per-session view of the destination: what an agent reads now.

It is the rolling summary followed by the raw batches after the summary's
range, never a summarised action twice. Sinks persist it in their table, so a
restart neither re-applies nor forgets anything; ``extra`` is the sink's own
bookkeeping (e.g. which Intercom note holds which range).
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import orjson

from schemas import ActionsWritten, SummaryReady
from schemas.ledger import SessionLedger
from streams.errors import AgentContextError

__all__ = [
    "Batch",
    "SessionContext",
    "Skip",
    "actions_range",
    "refused_key",
    "summary_block",
]


class Batch(msgspec.Struct, kw_only=True, gc=False):  # ints and a str: never in a cycle
    seq_from: int
    seq_to: int
    text: str


class Skip(AgentContextError):
    """The operation was applied before (a redelivery) or belongs to an older generation."""


class SessionContext(msgspec.Struct, kw_only=True):
    """A session's context: a msgspec Struct, built once per operation at a sink (a pydantic
    model cost a third of a null sink's own path: docs/decisions.md, "A sink's context is a
    msgspec Struct"). Stored as the model was, byte for byte (test_context.py, golden file)."""

    session_id: str
    generation: int = 0
    summary: str | None = None
    summary_to: int = 0  # the summary covers actions 1..summary_to
    actions_to: int = 0  # highest action sequence number applied
    batches: list[Batch] = msgspec.field(default_factory=list)
    closed: bool = False
    summaries: int = 0  # how many summaries this context has taken (for operators)
    ledger: SessionLedger | None = None  # the facts up to summary_to (schemas.ledger)
    # The generation before this one (the session went idle, then came back), kept
    # so its history stays in the context and its final summary, which may arrive
    # after the new generation's first batches, still replaces its raw batches.
    previous: SessionContext | None = None
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    # Operations the sink refused (dead-lettered), by ``refused_key``: a re-drive of
    # one of these is applied again, although the high-water marks are past it.
    refused: list[str] = msgspec.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The context as JSON values."""
        return msgspec.to_builtins(self)  # type: ignore[no-any-return]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SessionContext:
        """What :meth:`to_json` gave, validated (unknown fields ignored)."""
        return msgspec.convert(data, cls)

    def to_bytes(self) -> bytes:
        return orjson.dumps(self.to_json())

    @classmethod
    def from_bytes(cls, raw: bytes) -> SessionContext:
        return cls.from_json(orjson.loads(raw))

    def copy(self) -> SessionContext:
        """A deep copy, for a sink that may change it."""
        return copy.deepcopy(self)

    def advanced(self, op: ActionsWritten | SummaryReady) -> SessionContext:
        """The context after ``op``; raises :class:`Skip` if ``op`` was applied already.

        Across a generation change the order of operations is defined so: the new
        generation's operations apply at once; the old generation's late ones (its
        rolling and final summaries, still in the LLM when the session came back)
        apply to ``previous``. A generation older than that is skipped.
        tests/unit/test_context.py and tests/integration/test_fidelity.py prove it.
        """
        if op.generation < self.generation:
            if self.previous is None or op.generation != self.previous.generation:
                raise Skip(f"generation {op.generation} < {self.generation}")
            return self._copy(previous=self.previous.advanced(op))
        base = self
        if op.generation > self.generation:  # the session came back after it expired
            # ``extra`` is carried over: the sink decides what of its bookkeeping
            # outlives a generation (e.g. the session's Intercom conversation).
            earlier = _replace(self, previous=None, extra={}, refused=[])
            base = SessionContext(
                session_id=self.session_id,
                generation=op.generation,
                extra=self.extra,
                refused=self.refused,
                previous=earlier if self.actions_to else self.previous,
            )
        if op.op == "actions_written":
            if op.seq_to <= base.actions_to:
                raise Skip(f"actions up to {op.seq_to} applied already")
            batch = Batch(seq_from=op.seq_from, seq_to=op.seq_to, text=op.text)
            return base._copy(actions_to=op.seq_to, batches=[*base.batches, batch])
        # A final with the range of the summary before it closes the session (it went
        # idle right after that summary); anything else up to summary_to is a replay.
        closes = op.final and not base.closed and op.seq_to == base.summary_to
        if op.seq_to <= base.summary_to and not closes:
            raise Skip(f"summary up to {op.seq_to} applied already")
        return base._copy(
            summary=op.summary,
            summary_to=op.seq_to,
            ledger=op.ledger if op.ledger is not None else base.ledger,
            # A batch that arrived while the LLM was busy is not covered: it stays.
            batches=[b for b in base.batches if b.seq_from > op.seq_to],
            closed=op.final,
            summaries=base.summaries + (0 if closes else 1),
        )

    def _copy(self, **changes: Any) -> SessionContext:
        """A copy with ``changes``: the sink's ``extra`` copied deep (a sink may change it),
        the batches shared, never changed in place (test_context.py: ..._shares_batches...)."""
        extra = copy.deepcopy(self.extra) if self.extra else {}
        return _replace(self, extra=extra, **changes)

    def summary_text(self) -> str:
        """The summary part of the context: the earlier visit's, then this one's, each
        with its range and its ledger. What an SDK-style ``overwrite_with_summary`` gets."""
        parts = []
        if self.previous is not None:
            parts.append(
                f"Earlier visit (the session went idle, then came back; "
                f"this visit numbers its actions from 1 again):\n"
                f"{self.previous.render().rstrip()}"
            )
        if self.summary is not None:
            parts.append(summary_block(self.summary, self.summary_to, self.ledger, self.closed))
        return "\n\n".join(parts)

    def render(self) -> str:
        """The text an agent reads: the summary part, then the raw batches after it."""
        parts = [self.summary_text()] if self.previous is not None or self.summary else []
        parts.extend(b.text for b in self.batches)
        return "\n\n".join(parts) + ("\n" if parts else "")


_replace = msgspec.structs.replace


REFUSED_KEPT = 10_000  # per session; the oldest are forgotten (their re-drive is skipped)


def refused_key(op: ActionsWritten | SummaryReady) -> str:
    return f"{op.op}:g{op.generation}:{op.seq_from}-{op.seq_to}"


def actions_range(seq_from: int, seq_to: int) -> str:
    return f"action {seq_from}" if seq_from == seq_to else f"actions {seq_from}-{seq_to}"


def summary_block(
    summary: str, summary_to: int, ledger: SessionLedger | None, final: bool = False
) -> str:
    """One summary as an agent reads it: its range, its text, the session's facts."""
    label = f"Summary of {actions_range(1, summary_to)}"
    if final:
        label += " (final: the session went idle)"
    block = f"{label}:\n{summary}"
    return f"{block}\n\n{ledger.render()}" if ledger is not None else block
