"""What a sink worker reads (operations, links, re-driven dead letters) and the pull view."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgspec import to_builtins
from msgspec.structs import asdict

from schemas import InvalidMessage, SessionErased, SessionLink, decode
from schemas.fast import WrittenHeader, decode_context_message
from sinks.base import Operation
from sinks.context import SessionContext

__all__ = ["LaneItem", "Redriven", "decode_operation", "decode_redriven", "pull_view"]


@dataclass(frozen=True)
class Redriven:
    """A dead letter of this sink sent back (the original operation or link)."""

    item: Operation | SessionErased | SessionLink

    @property
    def session_id(self) -> str:
        return self.item.session_id


# (an ``InOrderAcks`` ticket for the event, the decoded message)
LaneItem = tuple[Any, "Operation | SessionErased | SessionLink | Redriven"]


def decode_redriven(raw: bytes | None, *, payload: bool = True) -> Redriven:
    """A context operation, or a link: what this sink's dead letters hold."""
    try:
        return Redriven(decode_operation(raw, payload=payload))
    except InvalidMessage:
        return Redriven(decode(SessionLink, raw))


def decode_operation(
    raw: bytes | None, *, payload: bool = True, header: bool = False
) -> Operation | SessionErased | WrittenHeader:
    """``payload=False``: an ``actions_written``'s payload neither parsed nor checked, left
    None (``Sink.reads_payload``); ``header`` too: such an operation as its header Struct
    (``Sink.delivers`` False: no model built for it)."""
    if raw is None:
        raise InvalidMessage("empty message (no value)")
    return decode_context_message(raw, payload=payload, header=header and not payload)


def pull_view(context: SessionContext) -> dict[str, Any]:
    """What ``GET /sessions/{id}/context`` answers: the context an agent reads, as text
    and as structured JSON (the summary, its facts, the raw batches after it)."""
    previous = context.previous
    return {
        "session_id": context.session_id,
        "generation": context.generation,
        "summary": context.summary,
        "summary_covers": [1, context.summary_to] if context.summary else None,
        "summaries": context.summaries,
        "actions_applied": context.actions_to,
        "closed": context.closed,
        "ledger": to_builtins(context.ledger),
        "actions": [asdict(b) for b in context.batches],
        "previous": None
        if previous is None
        else {
            "generation": previous.generation,
            "summary": previous.summary,
            "summary_covers": [1, previous.summary_to] if previous.summary else None,
            "actions_applied": previous.actions_to,
            "closed": previous.closed,
            "ledger": to_builtins(previous.ledger),
            "actions": [asdict(b) for b in previous.batches],
        },
        "text": context.render(),
    }
