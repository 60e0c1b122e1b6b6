"""A sink's session context: order, redelivery, and what a summary replaces."""

from __future__ import annotations

import pytest

from schemas import ActionsPayload, ActionsWritten, SummaryReady
from sinks.context import SessionContext, Skip


def written(a: int, b: int, generation: int = 0) -> ActionsWritten:
    return ActionsWritten(
        session_id="s",
        generation=generation,
        seq_from=a,
        seq_to=b,
        text=f"batch {a}-{b}",
        payload=ActionsPayload(session_id="s"),
        emitted_at=0.0,
    )


def summary(to: int, text: str = "sum", final: bool = False) -> SummaryReady:
    return SummaryReady(
        session_id="s",
        seq_from=1,
        seq_to=to,
        window_from=1,
        summary=text,
        final=final,
        emitted_at=0.0,
    )


def test_summary_replaces_only_the_batches_it_covers() -> None:
    ctx = SessionContext(session_id="s")
    for op in (written(1, 3), written(4, 6), written(7, 9)):
        ctx = ctx.advanced(op)
    ctx = ctx.advanced(summary(6, "first six"))
    assert [b.seq_from for b in ctx.batches] == [7]  # arrived while the LLM was busy: stays
    assert ctx.render() == "Summary of actions 1-6:\nfirst six\n\nbatch 7-9\n"


def test_redelivered_operations_are_skipped() -> None:
    ctx = SessionContext(session_id="s").advanced(written(1, 3)).advanced(summary(3))
    with pytest.raises(Skip):
        ctx.advanced(written(1, 3))
    with pytest.raises(Skip):
        ctx.advanced(summary(3))
    assert ctx.advanced(written(4, 5)).actions_to == 5


def test_a_new_generation_starts_a_fresh_context_and_old_ones_are_ignored() -> None:
    ctx = SessionContext(session_id="s").advanced(written(1, 3)).advanced(summary(3, final=True))
    assert ctx.closed
    fresh = ctx.advanced(written(1, 2, generation=50))
    assert fresh.generation == 50 and fresh.summary is None and fresh.actions_to == 2
    with pytest.raises(Skip):
        fresh.advanced(written(4, 4, generation=0))


def test_the_context_survives_its_table_encoding() -> None:
    ctx = SessionContext(session_id="s", extra={"notes": [["p1", 1, 3]]}).advanced(written(1, 3))
    assert SessionContext.from_bytes(ctx.to_bytes()) == ctx
