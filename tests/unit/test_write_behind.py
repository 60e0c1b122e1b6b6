"""The order in which ``WriteBehind`` produces, logs and acknowledges a unit."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from agents.accumulate.batches import TableBatches
from agents.accumulate.compiled import apply_compiled, compiled_for
from agents.accumulate.state import Limits
from streams._faust.write_behind import WriteBehind
from streams.observe import metrics
from tests.support.waiting import wait_for


class _Acks:
    """Appends recorded, each acknowledged when the test says so."""

    def __init__(self) -> None:
        self.appended: list[tuple[str, bytes | None]] = []
        self.pending: dict[str, asyncio.Future[Any]] = {}

    def future(self, name: str, value: bytes | None) -> asyncio.Future[Any]:
        self.appended.append((name, value))
        self.pending[name] = asyncio.get_running_loop().create_future()
        return self.pending[name]

    def resolve(self, name: str) -> None:
        self.pending.pop(name).set_result(SimpleNamespace(topic_partition=name, offset=0))


class _App:
    def __init__(self, acks: _Acks) -> None:
        self.appender = SimpleNamespace(append_all=self._changelog, append_keyed=self._keyed)
        self._acks = acks
        self.may_wait: list[bool] = []  # per changelog append
        self.no_metadata: set[str] = set()  # topics the producer has no metadata for yet
        self.produced: list[str] = []  # what went through ``append``'s await

    def _keyed(self, topic: str, key: bytes, value: bytes | None) -> Any:
        return None if topic in self.no_metadata else self._acks.future(topic, value)

    async def append(self, topic: str, key: bytes, value: bytes | None) -> Any:
        self.produced.append(topic)
        return self._acks.future(topic, value)

    def _changelog(
        self, topic: str, partition: int, records: Any, then: Any, *, may_wait: bool
    ) -> Any:
        self.may_wait.append(may_wait)
        [(_, value)] = records
        return self._acks.future(topic, value)


def _table(store: Any) -> Any:
    return SimpleNamespace(
        partition_for_key=lambda key: 0,
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "changelog"),
        data=store,
    )


async def _fail(where: str, exc: BaseException) -> None:
    raise AssertionError(f"{where}: {exc!r}")


async def test_deferred_records_wait_for_the_units_acks_and_the_changelog_for_theirs() -> None:
    # chaos.py --cluster: a summarize request acked while its batches were not.
    acks, acked = _Acks(), []
    table = _table(SimpleNamespace(set_persisted_offset=lambda tp, offset: None))
    source = SimpleNamespace(ack_all=acked.extend)

    app = _App(acks)
    writes = WriteBehind(cast(Any, app), on_error=_fail)
    writes.set(cast(Any, table), "s", b"state")
    await writes.send("context", "s", b"batch")
    await writes.send("summarize", "s", b"request", after_previous=True)
    writes.track(source, "input")
    await writes.seal()
    assert acks.appended == [("context", b"batch")]  # the request waits for the batch
    acks.resolve("context")
    await wait_for(lambda: len(acks.appended) > 1, timeout=5)
    assert acks.appended[1:] == [("summarize", b"request")]  # not logged yet
    acks.resolve("summarize")
    await wait_for(lambda: len(acks.appended) > 2, timeout=5)
    assert acks.appended[2:] == [("changelog", b"state")] and not acked
    assert app.may_wait == [True]  # it gates only the input's ack: it joins a later round
    acks.resolve("changelog")
    await wait_for(lambda: acked, timeout=5)
    assert acked == ["input"]


class _Store(dict[str, Any]):
    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        pass


async def test_the_store_keeps_the_object_readers_saw_pending() -> None:
    # One compact copy (WriteBehind.set's), not a second one in the store: the accumulator
    # keeps a session's decoded state against those bytes (DecodedEntries).
    acks, taken = _Acks(), []
    store = _Store()
    table = _table(store)
    app = _App(acks)

    def changelog(topic: str, partition: int, records: Any, then: Any, *, may_wait: bool) -> Any:
        [(_, value)] = records
        taken.append(then)
        return acks.future(topic, value)

    app.appender = SimpleNamespace(append_all=changelog)

    writes = WriteBehind(cast(Any, app), on_error=_fail)
    writes.set(cast(Any, table), "s", b"state")
    seen = writes.get(cast(Any, table), "s")
    await writes.seal()
    await wait_for(lambda: "changelog" in acks.pending, timeout=5)
    taken.pop()()  # the broker has the record: the store takes the value
    acks.resolve("changelog")
    await wait_for(lambda: not writes._overlay, timeout=5)
    assert store["s"] is seen


async def test_set_all_holds_a_keys_later_value_and_lets_go_once_the_table_has_it() -> None:
    """A null sink's run of slot records (``SinkStage.append_run``): one version for the run,
    the later of a key's two values read and stored, the next unit's value still read."""
    acks, taken, acked = _Acks(), [], []
    store = _Store()
    table = cast(Any, _table(store))
    app = _App(acks)

    def changelog(topic: str, partition: int, records: Any, then: Any, *, may_wait: bool) -> Any:
        taken.append((list(records), then))
        return acks.future(f"changelog-{len(taken)}", None)

    app.appender = SimpleNamespace(append_all=changelog)
    writes = WriteBehind(cast(Any, app), on_error=_fail)
    writes.track_all(SimpleNamespace(ack_all=acked.append), ["a", "b"])
    writes.set_all(table, ["s0", "s1", "s0"], [b"1", b"2", b"3"])
    assert (writes.get(table, "s0"), writes.get(table, "s1")) == (b"3", b"2")
    await writes.seal()
    writes.set(table, "s1", b"4")  # the next unit's
    await writes.seal()
    await wait_for(lambda: len(taken) == 2, timeout=5)
    assert taken[0][0] == [(b"s0", b"1"), (b"s1", b"2"), (b"s0", b"3")]
    taken[0][1]()  # the broker has the first unit's records: the store takes them
    acks.resolve("changelog-1")
    await wait_for(lambda: acked, timeout=5)
    assert acked == [["a", "b"]] and store == {"s0": b"3", "s1": b"2"}
    assert writes.get(table, "s1") == b"4" and list(writes.pending(table)) == [("s1", True)]


async def test_units_sealed_meanwhile_are_recorded_in_one_step() -> None:
    """ "drains": the units sealed while one waits for the broker go through their steps
    together, so their deferred messages share one round trip instead of one each (one
    step per unit capped a worker's units per second at one per round trip)."""
    acks = _Acks()
    writes = WriteBehind(cast(Any, _App(acks)), on_error=_fail)
    for n in (1, 2, 3):
        await writes.send(f"context-{n}", "s", b"batch")
        await writes.send(f"summarize-{n}", "s", b"request", after_previous=True)
        await writes.seal()
    acks.resolve("context-1")  # the first unit's request goes without waiting for the others
    await wait_for(lambda: len(acks.appended) == 4, timeout=5)
    for n in (2, 3):
        acks.resolve(f"context-{n}")
    await wait_for(lambda: len(acks.appended) == 6, timeout=5)
    # Every request is produced before any of them is acknowledged; each after its batch.
    assert [name for name, _ in acks.appended[3:]] == ["summarize-1", "summarize-2", "summarize-3"]


async def test_a_units_inputs_are_acknowledged_together_in_order_once_its_records_are() -> None:
    acks, acked = _Acks(), []
    table = _table(SimpleNamespace(set_persisted_offset=lambda tp, offset: None))
    source = SimpleNamespace(ack_all=acked.append)

    writes = WriteBehind(cast(Any, _App(acks)), on_error=_fail)
    for record in ("a", "b", "c"):
        writes.track(source, record)
    writes.set(cast(Any, table), "s", b"state")
    await writes.seal()
    await wait_for(lambda: "changelog" in acks.pending, timeout=5)
    assert not acked
    acks.resolve("changelog")
    await wait_for(lambda: acked, timeout=5)
    assert acked == [["a", "b", "c"]]


def test_ack_all_counts_the_records_the_consumer_had_not_acknowledged(tmp_path: Path) -> None:
    from faust.types import TP, ConsumerMessage

    from streams._faust.batch_source import BatchSource
    from streams.app import create_app
    from streams.settings import Settings

    app = create_app(Settings(data_dir=tmp_path), role="pipeline")
    app.topics._acking_topics.add("t")
    messages = [
        ConsumerMessage("t", 0, offset, 0.0, 0, None, b"k", b"v", None, 1, 1, TP("t", 0))
        for offset in range(3)
    ]
    for message in messages:
        app.consumer.track_message(message)
    app.consumer.ack(messages[1])  # acknowledged before
    counted: list[float] = []
    source = BatchSource.__new__(BatchSource)
    source.app = app
    source._acknowledged = cast(Any, SimpleNamespace(inc=counted.append))
    source.ack_all(messages)
    assert counted == [2] and all(m.acked for m in messages)
    assert app.consumer._acked[TP("t", 0)] == [1, 0, 2]


def test_the_compiled_transitions_bytes_are_kept_as_made_orjsons_copied_compact() -> None:
    """orjson's ``dumps`` keeps a ~4 KiB buffer behind each value, so a held value is
    copied compact; the compiled transition's bytes have none, and copying them was 1.6%
    of the pipeline worker (py-spy, session 41): ``exact`` keeps them as they are."""
    writes = WriteBehind(cast(Any, _App(_Acks())), on_error=_fail)
    table = _table(_Store())
    made = orjson.dumps({"a": 1})
    writes.set(table, "orjson", made)
    assert writes.get(table, "orjson") == made and writes.get(table, "orjson") is not made

    limits = Limits(threshold=10, max_actions_per_batch=100)
    if not compiled_for(limits):
        pytest.skip("native/ not built: the Python transition's bytes are all orjson's")
    batches = TableBatches(table, writes)
    raw = orjson.dumps(
        {"product_id": "p", "session_id": "s", "actions": [{"title": "a", "type": "click"}]}
    )
    done = apply_compiled(raw, lambda sid: None, 0, limits, 1.0, batches, None)
    assert done is not None and done.entry is not None
    put = dict(batches.staged)
    batches.commit("s", done.entry, exact=True)
    assert writes.get(table, "s") is done.entry
    assert [writes.get(table, key) is body for key, body in put.items()] == [True]


def test_the_compiled_transition_reads_what_this_worker_wrote_until_a_rebalance() -> None:
    """``TableBatches.written``: the entries and batches this worker wrote, read by the
    compiled transition without a call through the write-behind; deletions remembered as
    such, all of it forgotten past ``kept`` keys and at a new generation (a partition may
    come back with another worker's writes restored)."""
    limits = Limits(threshold=3, max_actions_per_batch=100)
    if not compiled_for(limits):
        pytest.skip("native/ not built")
    writes = WriteBehind(cast(Any, _App(_Acks())), on_error=_fail)
    table = _table(_Store())
    batches = TableBatches(table, writes, kept=4)
    batches.current(1)

    def payload(sid: str, title: str) -> bytes:
        action = {"title": title, "type": "click"}
        return orjson.dumps({"product_id": "p", "session_id": sid, "actions": [action]})

    def no_lookup(key: str) -> bytes | None:
        raise AssertionError(f"{key!r} looked up, not read from what was written")

    steps = [payload("s", "one"), payload("s", "two"), payload("s", "three")]
    for offset, raw in enumerate(steps):
        lookup = (lambda key: None) if offset == 0 else no_lookup  # a new session first
        done = apply_compiled(raw, lookup, offset, limits, 1.0, batches, None)
        assert done is not None and done.entry is not None
        batches.commit("s", done.entry, exact=True)
    # The third batch completed a request with the two before it, read from ``written``,
    # and was never stored: taken at once.
    assert [e.topic for e in done.out] == ["context", "summarize"]
    request = orjson.loads(done.out[1].value)
    assert [b["actions"][0]["title"] for b in request["batches"]] == ["one", "two", "three"]
    assert batches.written == {
        "s\x1f0": writes.get(table, "s\x1f0"),
        "s\x1f1": writes.get(table, "s\x1f1"),
        "s": done.entry,
    }

    batches.delete("s", 2)  # the session closed: its slots deleted, its entry too
    batches.commit("s", None)
    assert batches.written == dict.fromkeys(["s", "s\x1f0", "s\x1f1"])
    fresh = apply_compiled(payload("s", "again"), no_lookup, 9, limits, 2.0, batches, None)
    assert fresh is not None and not fresh.existed  # a deleted entry is a new session
    batches.discard()

    batches.commit("t0", b"{}")  # the fourth key: ``kept``
    assert list(batches.written) == ["s\x1f0", "s", "s\x1f1", "t0"]
    batches.commit("t1", b"{}")  # past ``kept``: all of it forgotten, what comes next kept
    assert batches.written == {}
    batches.commit("t2", b"{}")
    assert list(batches.written) == ["t2"]

    looked_up: list[str] = []
    batches.current(1)
    assert list(batches.written) == ["t2"]  # the same generation: kept
    batches.current(2)  # a rebalance: what this worker wrote may no longer be the table's
    assert batches.written == {}
    apply_compiled(
        payload("s", "later"), lambda k: looked_up.append(k), 10, limits, 3.0, batches, None
    )
    assert looked_up == ["s"]


async def test_records_are_appended_in_order_and_awaited_only_without_metadata() -> None:
    """``send_all``: appended without a coroutine each; a topic the producer has no
    metadata for yet goes through ``append``, which produces it; a deferred record waits."""
    acks = _Acks()
    app = _App(acks)
    app.no_metadata = {"new"}
    writes = WriteBehind(cast(Any, app), on_error=_fail)
    await writes.send_all(
        [
            ("context", "s", b"1", False),
            ("new", "s", b"2", False),
            ("summarize", "s", b"3", True),
            ("context", "t", b"4", False),
        ]
    )
    assert app.produced == ["new"]
    assert acks.appended == [("context", b"1"), ("new", b"2"), ("context", b"4")]


async def test_a_seal_that_waits_for_room_is_counted_and_one_that_does_not_is_not() -> None:
    """ "waits": ``ac_write_behind_wait_seconds_total`` counts only the time a stage
    could not seal because every unit ahead still waited for the broker (the bench
    reads it to tell a worker bound by its acknowledgements from one bound by its CPU)."""
    acks = _Acks()
    writes = WriteBehind(cast(Any, _App(acks)), max_units=1, stage="test-waits", on_error=_fail)
    waited = metrics.WRITE_BEHIND_WAITS.labels("test-waits")
    await writes.send("context-1", "s", b"batch")
    await writes.seal()
    await wait_for(writes._queue.empty, timeout=5)  # the first step holds it, not the queue
    await writes.send("context-2", "s", b"batch")
    await writes.seal()  # into the queue's one place: no wait
    assert waited._value.get() == 0
    await writes.send("context-3", "s", b"batch")
    sealing = asyncio.create_task(writes.seal())
    await wait_for(lambda: len(acks.appended) == 3, timeout=5)
    assert not sealing.done()  # no room until the first unit's message is acknowledged
    acks.resolve("context-1")
    await asyncio.wait_for(sealing, timeout=5)
    assert waited._value.get() > 0
