"""The compiled run (``native.transition_run``, ``Accumulator.run_compiled``) records and
emits what the per-payload path records and emits: each payload through the compiled
transition, ``TableBatches.commit`` and ``WriteBehind.send_all``, the Python transition
where the compiled one declines. Compared after every unit: the write-behind's overlay,
the unit's writes and deferred records, ``written``, the records appended per partition,
the replays, actions and new sessions."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.accumulate.batches import TableBatches
from agents.accumulate.compiled import apply_compiled, compiled_for, run_transitions
from agents.accumulate.state import Limits, SessionState, already_applied, apply_payload
from schemas import InvalidMessage
from schemas.fast import decode_payload
from scripts.bench.workload import workload
from streams._faust.write_behind import WriteBehind
from streams.partitions import partition_of
from tests.unit.test_compiled import LIMITS, SERVICE, plain_payloads, session_payloads, times
from tests.unit.test_fast_exact import dumps

PARTITIONS = 3
pytestmark = pytest.mark.skipif(not compiled_for(LIMITS), reason="native/ not built")


class _Appender:
    """Records appended per (topic, partition), in order; one future per append."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}

    def _future(self) -> Any:
        return SimpleNamespace()

    def append_keyed(self, topic: str, key: bytes, value: bytes | None) -> Any:
        self.records.setdefault((topic, partition_of(key, PARTITIONS)), []).append((key, value))
        return self._future()

    def append_run(self, topic: str, partition: int, records: list[Any]) -> Any:
        assert partition == partition_of(records[0][0], PARTITIONS)
        self.records.setdefault((topic, partition), []).extend(records)
        return self._future()


class _Side:
    """One worker's write-behind and store over a dict table."""

    def __init__(self, kept: int) -> None:
        self.appender = _Appender()
        app = SimpleNamespace(appender=self.appender)
        data: dict[str, bytes] = {}
        self.table = SimpleNamespace(data=data, get=data.get)
        self.writes = WriteBehind(cast(Any, app), on_error=_fail)
        self.store = TableBatches(cast(Any, self.table), self.writes, kept=kept)
        self.store.current(1)
        self.entry = functools.partial(self.writes.get, self.table)
        self.counts = {"replays": 0, "actions": 0, "refused": 0}
        self.new_sessions: list[str] = []

    def python_path(self, message: Any, now: float, limits: Limits) -> None:
        """The stage's Python branch for one payload (``Accumulator.transition``, save)."""
        try:
            payload = decode_payload(message.value)
        except InvalidMessage:
            self.counts["refused"] += 1
            return
        raw = self.entry(payload.session_id)
        state = None if raw is None else SessionState.from_bytes(raw)
        if already_applied(state, message.offset):
            self.counts["replays"] += 1
            return
        new, out = apply_payload(
            state, payload, message.offset, limits, now, store=self.store,
            ingested_at=message.timestamp,
        )  # fmt: skip
        self.store.commit(payload.session_id, new.to_bytes())
        self.emit(payload.session_id, [(e.topic, e.value) for e in out], state is None)
        self.counts["actions"] += len(payload.actions)

    def emit(self, sid: str, out: list[tuple[str, bytes]], new: bool) -> None:
        for topic, value in out:
            if topic == "summarize":
                self.writes._unit.deferred.append((topic, sid.encode(), value))
            else:
                self.appender.append_keyed(topic, sid.encode(), value)
        if new:
            self.new_sessions.append(sid)

    def view(self) -> Any:
        unit = self.writes._unit
        return (
            {key: held for (_, key), held in self.writes._overlay.items()},  # the table's id
            [(key, value, version) for _, key, value, version in unit.writes],
            list(unit.deferred),
            dict(self.store.written),
            {slot: list(records) for slot, records in self.appender.records.items()},
            dict(self.counts),
            list(self.new_sessions),
        )


async def _fail(where: str, exc: BaseException) -> None:
    raise AssertionError(f"{where}: {exc!r}")


def per_payload(side: _Side, messages: list[Any], now: float, limits: Limits) -> None:
    """Each payload by ``apply_compiled``, committed and emitted one at a time."""
    for message in messages:
        value, offset, timestamp = message.value, message.offset, message.timestamp
        done = None
        if value is not None:
            done = apply_compiled(value, side.entry, offset, limits, now, side.store, timestamp)
        if done is None:
            side.python_path(message, now, limits)
        elif done.entry is None:
            side.counts["replays"] += 1
        else:
            side.store.commit(done.session_id, done.entry, exact=True)
            side.emit(done.session_id, [(e.topic, e.value) for e in done.out], not done.existed)
            side.counts["actions"] += done.actions


def in_runs(side: _Side, messages: list[Any], now: float, limits: Limits) -> int:
    """As ``Accumulator.apply_messages``: runs, each stopping at a payload for the Python
    path. Returns how many payloads the runs took."""
    index, taken = 0, 0
    while index < len(messages):
        _, ran, actions, replays, new, runs = side.writes.run_compiled(
            run_transitions, side.table, messages, index, side.entry, side.store.written,
            side.store.kept, "summarize", PARTITIONS, now, limits,
        )  # fmt: skip
        taken += ran - index
        side.counts["actions"] += actions
        side.counts["replays"] += replays
        side.new_sessions += new
        for partition, records in runs:
            side.appender.append_run("context", partition, records)
        if ran == len(messages):
            break
        side.python_path(messages[ran], now, limits)
        index = ran + 1
    return taken


def same_units(units: list[list[Any]], limits: Limits, kept: int) -> int:
    """Both ways over the same units, from the same empty table: equal after each."""
    old, new = _Side(kept), _Side(kept)
    taken = 0
    for number, messages in enumerate(units):
        now = 1764856000.0 + number
        per_payload(old, messages, now, limits)
        taken += in_runs(new, messages, now, limits)
        assert new.view() == old.view(), number
    return taken


def _message(value: bytes | None, offset: int, timestamp: float | None) -> Any:
    return SimpleNamespace(value=value, offset=offset, timestamp=timestamp, tp=None)


unit_steps = st.lists(
    st.lists(
        st.tuples(
            st.none() | (session_payloads | plain_payloads | plain_payloads).map(dumps),
            st.integers(-1, 3),
            st.none() | st.just(0.0) | times,
        ),
        min_size=1,
        max_size=6,
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=400, deadline=None)
@given(unit_steps, st.sampled_from([2, 5, 1000]))
def test_a_run_records_and_emits_what_the_per_payload_path_does(
    generated: list[list[Any]], kept: int
) -> None:
    offset, units = 10, []
    for steps in generated:  # offsets mostly rising, some replayed
        unit = []
        for raw, delta, timestamp in steps:
            offset += delta
            unit.append(_message(raw, offset, timestamp))
        units.append(unit)
    same_units(units, LIMITS, kept)


def test_the_workloads_units_are_taken_by_runs_whole() -> None:
    """The bench's payloads over 40 sessions, in units of 64: every payload in a run,
    its requests included, and the same table, records and requests as before."""
    messages = [
        _message(orjson.dumps(data), offset, 1764856000.0 + offset / 7)
        for offset, data in enumerate(workload(3000, 40, 1, min_batch=1, max_batch=3))
    ]
    units = [messages[i : i + 64] for i in range(0, len(messages), 64)]
    assert same_units(units, SERVICE, kept=32_768) == len(messages)


def test_a_run_stops_at_what_the_compiled_transition_declines() -> None:
    """An erasure request, a payload without a value and one the Python path refuses
    each end a run; the next run starts after it."""
    payload = {"session_id": "s", "actions": [{"title": "t", "type": "click"}]}
    values = [
        orjson.dumps(payload),
        orjson.dumps({"type": "erase", "session_id": "s"}),
        orjson.dumps(payload),
        None,
        b"not json",
        orjson.dumps(payload),
    ]
    side = _Side(kept=1000)
    messages = [_message(v, offset, None) for offset, v in enumerate(values)]
    stops = []
    index = 0
    while index < len(messages):
        _, ran, *_ = side.writes.run_compiled(
            run_transitions, side.table, messages, index, side.entry, side.store.written,
            side.store.kept, "summarize", PARTITIONS, 1.0, LIMITS,
        )  # fmt: skip
        stops.append(ran)
        index = ran + 1
    assert stops == [1, 3, 4, 6]
