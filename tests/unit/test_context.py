"""A sink's session context: order, redelivery, and what a summary replaces."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import ActionsPayload, ActionsWritten, SummaryReady
from schemas.ledger import SessionLedger
from sinks.context import SessionContext, Skip
from sinks.context_store import ContextStore
from tests.support.tables import DictTable as _Table
from tests.support.tables import apply_writes as _apply


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


def test_advancing_shares_batches_and_copies_the_sinks_bookkeeping() -> None:
    ctx = SessionContext(session_id="s", extra={"notes": [1]}).advanced(written(1, 3))
    later = ctx.advanced(written(4, 6))
    assert later.batches[0] is ctx.batches[0]  # O(1) per operation, not O(window)
    later.extra["notes"].append(2)
    assert ctx.extra == {"notes": [1]}


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


def test_a_new_generation_starts_a_fresh_context_and_keeps_the_earlier_visit() -> None:
    ctx = SessionContext(session_id="s").advanced(written(1, 3)).advanced(summary(3, final=True))
    assert ctx.closed
    fresh = ctx.advanced(written(1, 2, generation=50))
    assert fresh.generation == 50 and fresh.summary is None and fresh.actions_to == 2
    assert fresh.previous is not None and fresh.previous.summary_to == 3
    assert fresh.render() == (
        "Earlier visit (the session went idle, then came back; this visit numbers its "
        "actions from 1 again):\nSummary of actions 1-3 (final: the session went idle):\nsum"
        "\n\nbatch 1-2\n"
    )
    with pytest.raises(Skip):  # the previous generation's replays
        fresh.advanced(summary(3, final=True))
    later = fresh.advanced(written(3, 3, generation=90))  # a third visit
    assert later.previous is not None and later.previous.generation == 50
    with pytest.raises(Skip):  # older than the previous generation
        later.advanced(summary(5, final=True))


def test_a_late_final_summary_of_the_previous_generation_replaces_its_batches() -> None:
    """The session came back while its final summary was in the LLM: the new visit's
    batches arrive first; the final still replaces the old visit's raw batches."""
    ctx = SessionContext(session_id="s")
    for op in (written(1, 3), summary(3, "first three"), written(4, 5)):
        ctx = ctx.advanced(op)
    ctx = ctx.advanced(written(1, 2, generation=50))
    assert ctx.previous is not None and [b.seq_from for b in ctx.previous.batches] == [4]
    ctx = ctx.advanced(summary(5, "all five", final=True))
    assert ctx.generation == 50 and [b.text for b in ctx.batches] == ["batch 1-2"]
    assert ctx.previous is not None and ctx.previous.batches == []
    assert ctx.previous.closed and ctx.previous.summary == "all five"
    assert "batch 4-5" not in ctx.render() and "all five" in ctx.render()


def test_a_close_right_after_a_summary_marks_the_context_final() -> None:
    ctx = SessionContext(session_id="s").advanced(written(1, 10)).advanced(summary(10, "ten"))
    closed = ctx.advanced(summary(10, "ten", final=True))
    assert closed.closed and closed.summaries == 1
    assert closed.render() == "Summary of actions 1-10 (final: the session went idle):\nten\n"
    with pytest.raises(Skip):
        closed.advanced(summary(10, "ten", final=True))


def test_ranges_read_in_the_numbering_of_the_raw_lines_and_in_good_english() -> None:
    ctx = SessionContext(session_id="s").advanced(written(1, 1)).advanced(summary(1, "one"))
    assert ctx.render().startswith("Summary of action 1:\none")
    text = ActionsPayload.model_validate(
        {"session_id": "s", "actions": [{"index": 0, "type": "click", "description": "Go"}]}
    ).numbered_text(13)
    assert text == "Session s — action 13\n[13] click: Go — "


def test_the_context_survives_its_table_encoding() -> None:
    ctx = SessionContext(session_id="s", extra={"notes": [["p1", 1, 3]]}).advanced(written(1, 3))
    assert SessionContext.from_bytes(ctx.to_bytes()) == ctx
    ledger = SessionLedger(actions=3, batches=1, pages={"/x": 3})
    came_back = ctx.advanced(summary(3).model_copy(update={"ledger": ledger}))
    came_back = came_back.advanced(written(1, 1, generation=9))
    assert SessionContext.from_bytes(came_back.to_bytes()) == came_back


def test_a_transition_is_a_copy_with_the_sinks_bookkeeping_its_own() -> None:
    """``SessionContext._copy``: every field as the constructor sets it, ``extra`` a copy."""
    ctx = SessionContext(session_id="s", extra={"notes": [1]}, refused=["r"])
    for op in [written(1, 2), written(3, 3), summary(2), written(4, 5)]:
        after = ctx.advanced(op)
        expected = SessionContext(
            **{k: getattr(after, k) for k in SessionContext.__struct_fields__}
        )
        assert after == expected and after.to_json() == expected.to_json()
        assert after.extra == ctx.extra and after.extra is not ctx.extra
        assert after is not ctx and ctx.refused == ["r"]
        ctx = after


def test_a_saved_context_loads_back_with_the_ledger_it_had_then() -> None:
    """The header's ledger is dumped once per ledger (``ContextStore._nested_json``), and
    what is stored is always the context's own: each save, loaded by a fresh store."""
    store, table = _store()
    first, second = (SessionLedger(actions=n, pages={f"/p{n}": n}) for n in (2, 5))
    ops = [written(1, 2), with_ledger(summary(2), first), written(3, 5)]
    ops += [with_ledger(summary(5), second), written(6, 6), written(1, 1, generation=3)]
    ctx = store.load("s")
    for op in ops:
        after = ctx.advanced(op)
        _apply(table, store.save(ctx, after))
        assert _fresh_load(table) == after, op
        ctx = after


def with_ledger(op: SummaryReady, ledger: SessionLedger) -> SummaryReady:
    return op.model_copy(update={"ledger": ledger})


def test_an_erased_context_is_not_loaded_before_its_tombstones_are_in() -> None:
    """An inline sink applies a batch before its writes are in the table: an operation
    after an erasure in the same batch starts from nothing, not from the erased context."""
    store, table = _store()
    ctx = store.load("s")
    after = ctx.advanced(written(1, 2))
    for _, key, value in store.save(ctx, after):
        assert value is not None
        table.values[key] = value
    store.erase(store.load("s"))  # its tombstones not in the table yet
    assert store.load("s") == SessionContext(session_id="s")


def test_a_batch_after_the_last_is_saved_alone_and_loaded_by_walking_on() -> None:
    """An append writes its batch record only (not the header with the summary and the
    sink's ``extra``); what a fresh store loads is still the whole context."""
    store, table = _store()
    ops: list[Any] = [written(1, 2), written(3, 3), written(4, 6), summary(3), written(7, 7)]
    ops += [summary(7), written(8, 9), written(10, 10), written(1, 1, generation=5)]
    header_writes = []
    ctx = store.load("s")
    for op in ops:
        after = ctx.advanced(op)
        writes = store.save(ctx, after)
        header_writes.append(sum(key == "s" for _, key, _ in writes))
        _apply(table, writes)
        assert _fresh_load(table) == after, op
        ctx = after
    # The first batch, each summary and the new generation write the header; appends do not.
    assert header_writes == [1, 0, 0, 1, 0, 1, 0, 0, 1]


def _store(table: _Table | None = None) -> tuple[ContextStore, _Table]:
    table = table or _Table()
    return ContextStore(
        cast(Any, SimpleNamespace(consumer_generation_id=1)), cast(Any, table)
    ), table


def _fresh_load(table: _Table) -> SessionContext:
    return _store(table)[0].load("s")


def test_an_operation_writes_one_record_and_a_summary_frees_the_slots_for_the_next() -> None:
    """A summary writes its header alone (no tombstone per batch it covers): the next
    batches overwrite the slots from 0. However long the window and however many
    summaries, each step is one record and the table holds the longest window's slots."""
    ops: list[Any] = [written(n, n) for n in range(1, 41)]  # a window of 40: summaries trail
    ops += [summary(30), written(41, 42), summary(42), written(43, 43)]
    for n in range(44, 200):
        ops += [written(n, n), summary(n)] if n % 10 == 0 else [written(n, n)]
    ops += [written(1, 2, generation=7), written(3, 3, generation=7)]  # the session came back
    store, table = _store()
    ctx = store.load("s")
    for op in ops:
        after = ctx.advanced(op)
        writes = store.save(ctx, after)
        assert len(writes) == (2 if ctx.actions_to == 0 else 1), op  # the first: slot and header
        _apply(table, writes)
        assert _fresh_load(table) == after, op
        ctx = after
    assert set(table.values) == {"s"} | {f"s\x1fs{n}" for n in range(40)}


def test_the_close_and_an_erasure_delete_every_slot_the_session_used() -> None:
    store, table = _store()
    ctx = store.load("s")
    for op in [*(written(n, n) for n in range(1, 8)), summary(5), written(8, 9), summary(9)]:
        _apply(table, store.save(ctx, after := ctx.advanced(op)))
        ctx = after
    assert len(table.values) == 1 + 7  # the header; 7 slots, the longest window
    closed = ctx.advanced(summary(9, "done", final=True))
    _apply(table, store.save(ctx, closed))
    assert set(table.values) == {"s"} and _fresh_load(table) == closed
    came_back = closed.advanced(written(1, 2, generation=3))
    _apply(table, store.save(closed, came_back))
    store, _ = _store(table)  # a store that loads it: the layout read back
    loaded = store.load("s")
    _apply(table, store.save(loaded, again := loaded.advanced(written(3, 3, generation=3))))
    assert _fresh_load(table) == again and "s\x1fs0" in table.values
    _apply(table, store.erase(store.load("s")))
    assert table.values == {}


def test_writes_logged_in_the_order_they_were_made_are_consistent_at_every_prefix() -> None:
    """A crash keeps a prefix of a session's changelog records. Logged as made, every
    prefix loads as a context the operations went through; reordered with the slots first
    (as a unit's writes were ranked before), a slot freed by a summary is overwritten
    before the header that freed it, and a prefix loads a window that never was."""
    ops: list[Any] = [written(1, 2), written(3, 3), summary(3), written(4, 5), written(6, 6)]
    ops += [summary(5), written(7, 7), summary(7, "done", final=True), written(1, 1, generation=2)]
    store, _ = _store()
    ctx, states, made = store.load("s"), [SessionContext(session_id="s")], []
    for op in ops:
        after = ctx.advanced(op)
        made += store.save(ctx, after)
        states.append(ctx := after)

    def prefixes_load_as_states(writes: list[Any]) -> bool:
        for end in range(len(writes) + 1):
            table = _Table()
            _apply(table, writes[:end])
            if table.values and _fresh_load(table) not in states:
                return False
        return True

    assert prefixes_load_as_states(made)
    slots_first = sorted(made, key=lambda write: write[1] == "s")  # stable: slots, headers
    assert not prefixes_load_as_states(slots_first)


def test_stale_slots_after_a_summary_or_a_new_visit_are_not_taken() -> None:
    """Slots a summary or a new generation let go of keep their batches until they are
    overwritten: loading walks on only to the batch that follows, of its generation."""
    store, table = _store()
    ctx = store.load("s")
    for op in (written(1, 2), written(3, 4), written(5, 5), summary(4)):
        _apply(table, store.save(ctx, after := ctx.advanced(op)))
        ctx = after
    assert "s\x1fs2" in table.values and _fresh_load(table) == ctx  # 5-5 inline, slots 0-2 stale
    came_back = ctx.advanced(written(5, 6, generation=8))  # 5-6 again: in another generation
    _apply(table, store.save(ctx, came_back))
    table.values["s\x1fs0"] = orjson.dumps(
        {"seq_from": 7, "seq_to": 7, "text": "x", "generation": 0}
    )
    assert _fresh_load(table) == came_back


def test_a_context_stored_before_slots_moves_inline_and_its_batch_keys_go() -> None:
    """A header written before slots (its batches under their first action's number)
    loads as it was; its next save writes the header with them inline and deletes them."""
    table = _Table()
    header = {"session_id": "s", "generation": 2, "summary": "sum", "summary_to": 2}
    header |= {"actions_to": 5, "first_batch": 3, "ledger": None, "previous": None}
    table.values["s"] = orjson.dumps(header)
    for a, b in ((3, 4), (5, 5)):
        fields = {"seq_from": a, "seq_to": b, "text": f"{a}-{b}", "generation": 2}
        table.values[f"s\x1f{a}"] = orjson.dumps(fields)
    store, _ = _store(table)
    before = store.load("s")
    after = before.advanced(written(6, 6, generation=2))
    _apply(table, store.save(before, after))
    assert set(table.values) == {"s"} and _fresh_load(table) == after
    again = after.advanced(written(7, 7, generation=2))
    _apply(table, store.save(after, again))
    assert set(table.values) == {"s", "s\x1fs0"} and _fresh_load(table) == again


def test_a_context_stored_before_batches_carried_their_generation_loads_as_it_was() -> None:
    table = _Table()
    header = {"session_id": "s", "generation": 2, "summary": "sum", "summary_to": 2}
    header |= {"actions_to": 5, "first_batch": 3, "ledger": None, "previous": None}
    table.values["s"] = orjson.dumps(header)
    for a, b in ((3, 4), (5, 5)):
        table.values[f"s\x1f{a}"] = orjson.dumps({"seq_from": a, "seq_to": b, "text": f"{a}-{b}"})
    loaded = _fresh_load(table)
    assert [(b.seq_from, b.seq_to) for b in loaded.batches] == [(3, 4), (5, 5)]
    assert (loaded.actions_to, loaded.summary, loaded.generation) == (5, "sum", 2)


def test_a_context_evicted_while_its_writes_are_pending_loads_from_them() -> None:
    """An inline sink's writes reach the table only once the broker has them (WriteBehind):
    a session loaded again meanwhile, after the cache let it go, reads them, not the table."""
    app, table = SimpleNamespace(consumer_generation_id=1), _Table()
    pending: dict[str, bytes | None] = {}

    def read(_: Any, key: str) -> bytes | None:
        return pending[key] if key in pending else table.values.get(key)

    store = ContextStore(cast(Any, app), cast(Any, table), cache_size=1, read=read)
    contexts = {}
    for sid in ("a", "b"):
        before = store.load(sid)
        op = written(1, 2).model_copy(update={"session_id": sid})
        contexts[sid] = before.advanced(op)
        pending.update((key, value) for _, key, value in store.save(before, contexts[sid]))
    assert not table.values  # nothing acknowledged yet
    assert store.load("a") == contexts["a"]  # "a" left the cache when "b" came in
    # The pull view asks ``get`` whether a session has a context: it has one already.
    assert store.get("b") is not None and store.get("c") is None


@pytest.mark.parametrize(("cache_size", "decoded"), [(3, 0), (2, 6)])
def test_live_sessions_past_the_cache_are_decoded_per_operation(
    cache_size: int, decoded: int
) -> None:
    """``AC_SINK_CONTEXT_CACHE``: three sessions in turn fit a cache of three, and are each
    decoded from the table at every operation with room for two (LRU), each counted
    (``ac_sink_contexts_decoded_total``), each loading what was saved."""
    table, count = _Table(), []
    app = cast(Any, SimpleNamespace(consumer_generation_id=1))
    store = ContextStore(
        app, cast(Any, table), cache_size=cache_size, decoded=lambda: count.append(1)
    )
    saved = {}
    for seq in (1, 2, 3):
        for sid in ("a", "b", "c"):
            before = store.load(sid)
            assert before == saved.get(sid, SessionContext(session_id=sid))
            saved[sid] = before.advanced(written(seq, seq).model_copy(update={"session_id": sid}))
            _apply(table, store.save(before, saved[sid]))
    assert len(count) == decoded  # the first round found nothing stored: nothing decoded


def _stored_steps() -> list[tuple[Any, dict[str, Any]]]:
    """Operations with what a sink puts in ``extra`` after each: every kind of save."""
    first, second = (SessionLedger(actions=n, pages={f"/p{n}": n}) for n in (2, 6))
    return [
        (written(1, 2), {"note": [1, 2]}),
        (with_ledger(summary(2), first), {}),
        (written(3, 4), {}),
        (written(6, 6), {}),  # a gap: the header too
        (with_ledger(summary(6), second), {"note": "after"}),
        (written(7, 7), {}),
        (written(1, 3, generation=4), {}),  # came back: the earlier visit nested
        (summary(7, "late final", final=True), {}),  # the earlier visit's late final
        (written(4, 4, generation=4), {}),
        (summary(4, "closed").model_copy(update={"generation": 4, "final": True}), {}),
    ]


def _writes_of(store: ContextStore, table: _Table) -> list[list[Any]]:
    steps, ctx = [], store.load("s")
    for op, extra in _stored_steps():
        after = ctx.advanced(op)
        after.extra.update(extra)
        writes = store.save(ctx, after)
        _apply(table, writes)
        steps.append([[key, None if value is None else value.decode()] for _, key, value in writes])
        ctx = after
    return steps


GOLDEN = Path(__file__).parent / "data" / "context_writes.json"


@given(text=st.text(), seq=st.integers(1, 2**62), generation=st.integers(0, 2**62))
def test_a_slot_holds_its_batch_as_orjson_wrote_it(text: str, seq: int, generation: int) -> None:
    """A slot's record, encoded by msgspec, is the bytes orjson wrote for the batch's fields
    and its generation (escapes, non-ASCII text, large numbers): loads read either."""
    store, table = _store()
    first = written(seq, seq, generation).model_copy(update={"text": text})
    second = written(seq + 1, seq + 1, generation).model_copy(update={"text": text})
    context = SessionContext(session_id="s").advanced(first)
    _apply(table, store.save(SessionContext(session_id="s"), context))
    (write,) = store.save(context, context.advanced(second))  # a batch after the last: its slot
    fields = {"seq_from": seq + 1, "seq_to": seq + 1, "text": text, "generation": generation}
    assert write[2] == orjson.dumps(fields)


def test_a_context_is_stored_byte_for_byte_as_the_pydantic_model_stored_it() -> None:
    """The Struct context (session 25) writes the records the pydantic model wrote (the
    golden file, from e1d3724): a rolling upgrade or a rollback reads the other's table."""
    store, table = _store()
    assert _writes_of(store, table) == orjson.loads(GOLDEN.read_bytes())
    assert _fresh_load(table).closed and _fresh_load(table).previous is not None
