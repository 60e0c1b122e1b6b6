"""``ContextStore.append_run``: a sink that delivers nothing (``Sink.delivers``) stores each
batch right after the session's last from the operation's bytes alone, compiled
(``native.Appends``) or by its Python twin (``sinks.context_heads.Heads``). It must write
what ``load``, ``advanced`` and ``save`` write, and load the same context, whatever comes
between: summaries, replays, gaps, new visits, erasures, evictions and rebalances."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ActionsWritten, SummaryReady
from sinks.context import SessionContext, Skip
from sinks.context_store import ContextStore
from tests.support.tables import DictTable, apply_writes

# Texts each twin writes its own way or declines: quotes, escapes, controls, beyond ASCII.
_TEXTS = ["", 'a "quoted" \\ path\nnext line', "tab\there\r\x01\x7f", "é ✓ \u2028 \U0001f600"]


def _written(sid: str, a: int, b: int, generation: int, text: str = "") -> ActionsWritten:
    return ActionsWritten.model_construct(
        session_id=sid, seq_from=a, seq_to=b, generation=generation, text=f"{sid} {a}-{b}{text}",
        payload=None, emitted_at=1.0, op="actions_written", product_id="", conversation_id=None,
        ingested_at=0.0, acted_at=0.0,
    )  # fmt: skip


def _summary(sid: str, to: int, generation: int, final: bool) -> SummaryReady:
    return SummaryReady(
        session_id=sid, seq_from=1, seq_to=to, generation=generation, summary=f"up to {to}",
        window_from=1, final=final, emitted_at=1.0,
    )  # fmt: skip


class _Run:
    """The same operations through the general path, and through ``append_run`` first."""

    def __init__(self, cache_size: int, compiled: bool = True) -> None:
        self.app = SimpleNamespace(consumer_generation_id=1)
        self.tables = DictTable(), DictTable()
        self.stores = [
            ContextStore(
                cast(Any, self.app), cast(Any, table), cache_size=cache_size, compiled=compiled
            )
            for table in self.tables
        ]
        self.appended = 0

    def general(self, store: ContextStore, table: DictTable, op: Any) -> None:
        if op == "erase":
            return apply_writes(table, store.erase(store.load("s")))
        before = store.load(op.session_id)
        try:
            after = before.advanced(op)
        except Skip:
            return None
        apply_writes(table, store.save(before, after))

    def step(self, op: Any) -> None:
        self.batch([op])

    def batch(self, ops: list[Any]) -> None:
        """``ops`` as one fetched batch: each by the general path, and as
        ``SinkStage.feed_inline`` applies them, runs by ``append_run`` first."""
        for op in ops:
            self.general(self.stores[0], self.tables[0], op)
        store, table = self.stores[1], self.tables[1]
        values = [None if op == "erase" else op.model_dump_json().encode() for op in ops]
        at = 0
        while at < len(ops):
            count, keys, records, _ = store.append_run(values, at, 9.0)
            apply_writes(table, [(table, k, v) for k, v in zip(keys, records, strict=True)])
            self.appended += count
            if (at := at + count) < len(ops):
                self.general(store, table, ops[at])
                at += 1

    def check(self) -> None:
        assert self.tables[0].values == self.tables[1].values
        loaded = [store.load("s") for store in self.stores]
        fresh = ContextStore(cast(Any, self.app), cast(Any, self.tables[1])).load("s")
        assert loaded[0] == loaded[1] == fresh


def _operations(draw: Any) -> list[Any]:
    ops: list[Any] = []
    generation, actions_to, summary_to, earlier_to = 0, 0, 0, 0
    for kind in draw(st.lists(st.sampled_from("nnnnnnrgsSfvleEEEbc"), max_size=40)):
        size = draw(st.integers(1, 3))
        if kind == "n":  # the next batch
            text = draw(st.sampled_from(_TEXTS))
            ops.append(_written("s", actions_to + 1, actions_to + size, generation, text))
            actions_to += size
        elif kind == "r" and actions_to:  # a replay of an earlier batch
            a = draw(st.integers(1, actions_to))
            ops.append(_written("s", a, min(a + size - 1, actions_to), generation))
        elif kind == "g":  # a gap: the batch after it, a batch dead-lettered before
            ops.append(_written("s", actions_to + 2, actions_to + 1 + size, generation))
            actions_to += 1 + size
        elif kind in "sS" and actions_to:  # a summary, of all or of part
            to = actions_to if kind == "s" else draw(st.integers(1, actions_to))
            ops.append(_summary("s", to, generation, final=False))
            summary_to = max(summary_to, to)
        elif kind == "f" and actions_to:  # the close
            ops.append(_summary("s", actions_to, generation, final=True))
        elif kind == "v":  # the session came back: a new visit
            earlier_to = actions_to
            generation, actions_to, summary_to = generation + 1, size, 0
            ops.append(_written("s", 1, size, generation))
        elif kind == "l" and generation:  # a late batch of the earlier visit
            ops.append(_written("s", earlier_to + 1, earlier_to + size, generation - 1))
            earlier_to += size
        elif kind == "e":
            ops.append("erase")
            generation, actions_to, summary_to = generation + 1, 0, 0
        elif kind == "E":  # another session's batch: evicts "s" from a small cache
            ops.append(_written(f"t{len(ops)}", 1, 1, 0))
        elif kind == "b":  # a rebalance: the cache is dropped
            ops.append("rebalance")
        elif kind == "c":  # the contexts compared midway
            ops.append("check")
    return ops


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "python"])
@settings(max_examples=300, deadline=None)
@given(st.composite(_operations)(), st.sampled_from([1, 2, 10_000]), st.integers(1, 5))
def test_an_append_writes_and_loads_what_the_general_path_does(
    compiled: bool, ops: list[Any], cache: int, batch_size: int
) -> None:
    """Operations in fetched batches of up to ``batch_size`` (a rebalance or a check between)."""
    run = _Run(cache, compiled)
    batch: list[Any] = []
    for op in [*ops, "end"]:
        if op not in ("rebalance", "check", "end") and len(batch) < batch_size:
            batch.append(op)
            continue
        run.batch(batch)
        assert run.tables[0].values == run.tables[1].values
        batch = [] if op in ("rebalance", "check", "end") else [op]
        if op == "rebalance":
            run.app.consumer_generation_id += 1
        elif op == "check":
            run.check()
    run.batch(batch)
    run.check()


def test_the_common_operation_is_appended_without_a_context_built() -> None:
    """After the session's first batch, each next one is ``append``'s (one slot record),
    until a summary; the summary's context has every batch appended before it."""
    run = _Run(10_000)
    for n in range(1, 10):
        run.step(_written("s", n, n, 0))
    assert run.appended == 8  # the first wrote the header: the general path
    run.step(_summary("s", 7, 0, final=False))
    run.check()
    context = run.stores[1].load("s")
    assert [b.seq_from for b in context.batches] == [8, 9] and context.summary == "up to 7"
    assert context == SessionContext.from_json(context.to_json())


def test_a_context_stored_before_slots_is_saved_whole_before_any_append() -> None:
    """A header from before slots (its batches under their first action's number) moves
    them inline at its next save: ``append`` leaves that save to the general path."""
    run = _Run(10_000)
    header = {"session_id": "s", "generation": 2, "summary": "sum", "summary_to": 2}
    header |= {"actions_to": 5, "first_batch": 3, "ledger": None, "previous": None}
    for table in run.tables:
        table.values["s"] = orjson.dumps(header)
        for a, b in ((3, 4), (5, 5)):
            fields = {"seq_from": a, "seq_to": b, "text": f"{a}-{b}", "generation": 2}
            table.values[f"s\x1f{a}"] = orjson.dumps(fields)
    for store in run.stores:
        store.load("s")  # cached with its legacy layout
    run.step(_written("s", 6, 6, 2))
    run.step(_written("s", 7, 7, 2))
    assert run.appended == 1  # the second only: the first moved the batches inline
    assert set(run.tables[1].values) == {"s", "s\x1fs0"}
    run.check()
