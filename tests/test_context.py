"""A sink's session context: order, redelivery, and what a summary replaces."""

from __future__ import annotations

import pytest

from schemas import ActionsPayload, ActionsWritten, SummaryReady
from sinks.context import SessionContext, Skip
from sinks.context_store import _changed_batches


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


def test_a_save_writes_only_the_batches_an_operation_added_or_dropped() -> None:
    """What ``ContextStore.save`` writes, replayed onto a store of batch keys, is the
    context's window; and a step touches only what it changed, however long the window."""
    ops = [written(n, n) for n in range(1, 41)]  # a window of 40: summaries trail the actions
    ops += [summary(30), written(41, 42), summary(42), written(43, 43)]
    ops += [written(1, 2, generation=7), written(3, 3, generation=7)]  # the session came back
    stored: set[int] = set()
    ctx = SessionContext(session_id="s")
    for op in ops:
        after = ctx.advanced(op)
        added, dropped = _changed_batches(ctx, after)
        stored -= {b.seq_from for b in dropped}
        stored |= {b.seq_from for b in added}
        assert stored == {b.seq_from for b in after.batches}, op
        if op.generation == ctx.generation and isinstance(op, ActionsWritten):
            assert (added, dropped) == ([after.batches[-1]], [])
        elif op.generation == ctx.generation:  # a summary: the batches it covers go
            assert (added, dropped) == ([], ctx.batches[: len(ctx.batches) - len(after.batches)])
        ctx = after
