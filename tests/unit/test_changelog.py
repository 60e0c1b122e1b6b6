"""``changelog.write_all`` (one append and one store update per table partition) against
the per-record path it replaced, the oracle: the same records on each partition in the
same order, the same store contents once acknowledged, the same acknowledgements."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest
from faust.stores.memory import Store as MemoryStore
from hypothesis import given, settings
from hypothesis import strategies as st

from streams._faust import changelog
from streams._faust.raw_table import RawTable, SessionKeyedTable
from streams.native import native
from streams.partitions import partition_of
from streams.tables import batch_key, session_of


class _Appender:
    """Like ``streams._faust.appender.Appender``: a group per (topic, partition) shares one
    acknowledgement; its ``then`` callbacks run in append order when it is delivered."""

    def __init__(self) -> None:
        self.records: dict[tuple[str, int], list[tuple[bytes, bytes | None]]] = {}
        self.then: dict[tuple[str, int], list[Any]] = {}

    def append(
        self, topic: str, partition: int, key: bytes, value: Any, then: Any
    ) -> tuple[str, int]:
        return self.append_all(topic, partition, [(key, value)], then)

    def append_all(
        self, topic: str, partition: int, records: Any, then: Any, *, may_wait: bool = False
    ) -> tuple[str, int]:
        slot = (topic, partition)
        self.records.setdefault(slot, []).extend(records)
        self.then.setdefault(slot, []).append(then)
        return slot  # the group's shared acknowledgement

    def deliver(self) -> None:
        for callbacks in self.then.values():
            for then in callbacks:
                then()


def _old_write(app: Any, table: Any, key: str, value: bytes | None) -> Any:
    """The per-record write this replaces (873a9aa), with its store update."""
    partition = table.partition_for_key(key)
    store = table.data

    def put() -> None:
        data = store.data if isinstance(store, MemoryStore) else store
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value

    topic = table.changelog_topic.get_topic_name()
    return app.appender.append(topic, partition, key.encode(), value, then=put)


def _table(name: str, memory: bool) -> Any:
    store: Any
    if memory:
        store = MemoryStore.__new__(MemoryStore)
        store.data = {}
    else:
        store = {}
    return SimpleNamespace(
        partition_for_key=lambda key: partition_of(session_of(key), 4),
        changelog_topic=SimpleNamespace(get_topic_name=lambda: f"{name}-changelog"),
        data=store,
    )


def _contents(table: Any) -> dict[str, bytes]:
    return dict(table.data.data if isinstance(table.data, MemoryStore) else table.data)


_write = st.tuples(
    st.sampled_from([0, 1]),  # which table
    st.sampled_from(["s1", "s2", "s3", "s4", "s5"]),
    st.none() | st.integers(0, 3),  # the session entry, or one of its batches
    st.none() | st.binary(max_size=4),
)


@given(units=st.lists(st.lists(_write, max_size=12), max_size=4))
@settings(max_examples=200, deadline=None)
def test_write_all_appends_and_stores_what_the_per_record_writes_did(units: Any) -> None:
    sides = []
    for write in (_old_write, None):
        tables = [_table("a", memory=True), _table("b", memory=False)]
        app = SimpleNamespace(appender=_Appender())
        acks = []
        for unit in units:
            writes = [
                (tables[t], sid if index is None else batch_key(sid, index), value)
                for t, sid, index, value in unit
            ]
            if write is None:
                written = changelog.write_all(cast(Any, app), writes)
            else:
                written = [(w[0], write(app, *w)) for w in writes]
            acks.append({(tables.index(table), ack) for table, ack in written})
        app.appender.deliver()
        sides.append((app.appender.records, acks, [_contents(t) for t in tables]))
    assert sides[0] == sides[1]


def test_write_all_of_nothing_appends_nothing() -> None:
    app = SimpleNamespace(appender=_Appender())
    assert changelog.write_all(cast(Any, app), []) == []
    assert not app.appender.records


def _raw_table(cls: type, partitions: int) -> Any:
    """A table of ``cls`` with only what finding a key's partition reads."""
    table = cls.__new__(cls)
    table.__dict__["partition_count"] = partitions  # the cached_property's value
    return table


_keys = st.lists(
    st.tuples(
        st.sampled_from([0, 1, 2]),  # session-keyed, raw, or a table with only the method
        st.text(max_size=6) | st.sampled_from(["s", "s\x1f0", "s\x1f12", "caf\u00e9\x1f1"]),
        st.none() | st.binary(max_size=3),
    ),
    max_size=20,
)


@given(_keys)
@settings(max_examples=300, deadline=None)
def test_the_compiled_runs_are_the_python_twins(writes: Any) -> None:
    """``native.changelog_runs`` finds each key's partition as the table's own
    ``partition_for_key`` does (a session-keyed table by the part before the separator),
    and groups and encodes as ``changelog._runs``."""
    if native is None:
        pytest.skip("native/ not built: the Python twin runs alone")
    method = SimpleNamespace(partition_for_key=lambda key: len(key) % 3)
    tables = [_raw_table(SessionKeyedTable, 5), _raw_table(RawTable, 7), method]
    given_writes = [(tables[t], key, value, 0) for t, key, value in writes]
    assert native.changelog_runs(given_writes) == changelog._runs(given_writes)
    for table, partition, entries, _ in native.changelog_runs(given_writes):
        assert {table.partition_for_key(key) for key, _ in entries} == {partition}
