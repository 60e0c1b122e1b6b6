"""``WriteBehind``'s checkpoints: the writes of the units sealed within ``checkpoint_s``
logged together, each key's last value once, in crash-safe order, and only then the
units' inputs acknowledged."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from streams._faust import write_behind
from streams._faust.write_behind import WriteBehind
from tests.support.waiting import wait_for

Record = tuple[str, "bytes | None"]


class _Broker:
    """The fake app's appender: every changelog append kept (its records in order) with
    the acknowledgement the test gives; other messages acknowledged at once."""

    def __init__(self) -> None:
        self.logged: list[list[Record]] = []
        self.unconfirmed: list[tuple[asyncio.Future[Any], Any]] = []
        self.appender = SimpleNamespace(append_all=self._append_all)
        self.flow_control = SimpleNamespace(manage_queue=lambda queue: None)

    async def append(self, topic: str, key: bytes, value: bytes | None) -> Any:
        done = asyncio.get_running_loop().create_future()
        done.set_result(SimpleNamespace(topic_partition=topic, offset=0))
        return done

    def _append_all(self, topic: str, partition: int, records: Any, then: Any) -> Any:
        self.logged.append([(key.decode(), value) for key, value in records])
        ack = asyncio.get_running_loop().create_future()
        self.unconfirmed.append((ack, then))
        return ack

    def confirm(self) -> None:
        """The broker has every record so far: the store applies them, the acks resolve."""
        for ack, then in self.unconfirmed:
            then()
            ack.set_result(SimpleNamespace(topic_partition="changelog", offset=0))
        self.unconfirmed.clear()


class _Store(dict[str, Any]):
    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        pass


def _table(store: _Store) -> Any:
    return SimpleNamespace(
        partition_for_key=lambda key: 0,
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "changelog"),
        data=store,
        get=store.get,
    )


async def _fail(where: str, exc: BaseException) -> None:
    raise AssertionError(f"{where}: {exc!r}")


def _rank(key: str, value: bytes | None) -> int:
    """``session_rank`` over readable keys: batches ("s/0"), session entries, deletions."""
    if "/" in key:
        return 0 if value is not None else 2
    return 1


def _writes(broker: _Broker, checkpoint_s: float) -> WriteBehind:
    return WriteBehind(cast(Any, broker), checkpoint_s=checkpoint_s, on_error=_fail, order_of=_rank)


async def _unit(writes: WriteBehind, table: Any, *sets: Record, source: Any = None) -> None:
    for key, value in sets:
        writes.set(table, key, value)
    if source is not None:
        writes.track(source, f"input-{len(sets)}")
    await writes.seal()


async def test_a_checkpoint_logs_each_key_once_its_last_value_and_then_acks_its_inputs() -> None:
    broker, store, acked = _Broker(), _Store(), []
    table, source = _table(store), SimpleNamespace(ack_all=acked.extend)
    writes = _writes(broker, checkpoint_s=60)
    await _unit(writes, table, ("s/0", b"b0"), ("s", b"e1"), source=source)
    await _unit(writes, table, ("s/1", b"b1"), ("s", b"e2"), source=source)
    await _unit(writes, table, ("s/0", None), ("s/1", None), ("s", b"e3"), source=source)
    assert writes.get(table, "s") == b"e3" and writes.get(table, "s/0") is None
    await asyncio.sleep(0)  # the stage takes the units; their checkpoint is not due
    assert broker.logged == []
    writes.clear()  # a revocation: Faust waits for the inputs, so it is logged at once
    await wait_for(lambda: broker.logged, timeout=5)
    # The batches were written and deleted within it, never in the store: no record.
    assert broker.logged == [[("s", b"e3")]] and acked == []
    broker.confirm()
    await wait_for(lambda: acked, timeout=5)
    assert acked == ["input-2", "input-2", "input-3"]
    assert store == {"s": b"e3"} and not writes._overlay


async def test_a_deletion_of_a_key_the_store_holds_is_logged_after_the_entry() -> None:
    broker, store = _Broker(), _Store({"s/0": b"durable"})
    table, writes = _table(store), _writes(broker, checkpoint_s=60)
    await _unit(writes, table, ("s/1", b"b1"), ("s", b"e1"))
    await _unit(writes, table, ("s/0", None), ("s", b"e2"))
    writes.clear()
    await wait_for(lambda: broker.logged, timeout=5)
    assert broker.logged == [[("s/1", b"b1"), ("s", b"e2"), ("s/0", None)]]


async def test_a_checkpoint_is_logged_once_its_interval_has_passed() -> None:
    broker = _Broker()
    table, writes = _table(_Store()), _writes(broker, checkpoint_s=0.3)
    await _unit(writes, table, ("s", b"e1"))
    await _unit(writes, table, ("s", b"e2"))
    await asyncio.sleep(0)
    assert broker.logged == []  # the stage waits for more, or for the interval
    await wait_for(lambda: broker.logged, timeout=5)  # no further unit needed
    assert broker.logged == [[("s", b"e2")]]


async def test_a_unit_whose_key_goes_back_to_an_earlier_rank_is_logged_alone() -> None:
    """ "alone": merged, a batch entry deleted and then written anew would keep only its
    new value, written before the session entry: a crash right after it would leave the
    durable entry naming the new batch. Logged alone, the unit keeps its own order."""
    broker = _Broker()
    table, writes = _table(_Store()), _writes(broker, checkpoint_s=60)
    await _unit(writes, table, ("s/0", b"old"), ("s", b"e1"))
    await _unit(writes, table, ("s/0", None), ("s", b"e2"), ("s/0", b"new"))
    await wait_for(lambda: len(broker.logged) == 2, timeout=5)
    assert broker.logged == [
        [("s/0", b"old"), ("s", b"e1")],
        [("s/0", None), ("s", b"e2"), ("s/0", b"new")],
    ]


async def test_a_checkpoint_past_its_size_is_logged_early(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(write_behind, "CHECKPOINT_MAX_ITEMS", 3)
    broker = _Broker()
    table, writes = _table(_Store()), _writes(broker, checkpoint_s=60)
    await _unit(writes, table, ("a", b"1"), ("b", b"1"))
    await asyncio.sleep(0)
    assert broker.logged == []
    await _unit(writes, table, ("c", b"1"))
    await wait_for(lambda: broker.logged, timeout=5)
    assert broker.logged == [[("a", b"1"), ("b", b"1"), ("c", b"1")]]
