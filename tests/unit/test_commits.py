"""``Commits``: the commit protocol's steps 3-5 taken once for the inputs whose outputs
the broker acknowledged together, and each input acknowledged only after them."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from streams._faust.commit import Commits
from tests.support.waiting import wait_for


class _App:
    """An appender whose changelog appends the test acknowledges (or fails)."""

    def __init__(self) -> None:
        self.appender = SimpleNamespace(append_all=self._append_all)
        self.appends: list[list[tuple[bytes, bytes | None]]] = []
        self.acks: list[asyncio.Future[Any]] = []

    def _append_all(
        self, topic: str, partition: int, records: Any, then: Any, *, may_wait: bool = False
    ) -> asyncio.Future[Any]:
        self.appends.append(list(records))
        ack = asyncio.get_running_loop().create_future()
        self.acks.append(ack)
        return ack


def _table() -> Any:
    return SimpleNamespace(
        partition_for_key=lambda key: 0,
        changelog_topic=SimpleNamespace(get_topic_name=lambda: "changelog"),
        data=SimpleNamespace(set_persisted_offset=lambda tp, offset: None),
    )


async def _inputs(
    commits: Commits, table: Any, keys: list[str], outputs: asyncio.Future[Any]
) -> tuple[list[asyncio.Task[None]], list[str]]:
    acknowledged: list[str] = []

    def acknowledge(key: str) -> Any:
        async def done() -> None:
            acknowledged.append(key)

        return done

    tasks = [
        asyncio.create_task(
            commits.commit(acknowledge(key), outputs=[outputs], writes=[(table, key, key.encode())])
        )
        for key in keys
    ]
    return tasks, acknowledged


async def test_inputs_acknowledged_together_share_one_changelog_append() -> None:
    app = _App()
    table, commits = _table(), Commits(cast(Any, app))
    loop = asyncio.get_running_loop()
    together, later = loop.create_future(), loop.create_future()
    first, acknowledged = await _inputs(commits, table, ["a", "b", "c"], together)
    second, acknowledged_later = await _inputs(commits, table, ["d"], later)
    together.set_result(None)
    await wait_for(lambda: len(app.appends) == 1)
    assert app.appends == [[(b"a", b"a"), (b"b", b"b"), (b"c", b"c")]]
    assert acknowledged == []  # step 5 only after step 4
    app.acks[0].set_result(SimpleNamespace(topic_partition="changelog-0", offset=2))
    await asyncio.gather(*first)
    assert acknowledged == ["a", "b", "c"]

    later.set_result(None)
    await wait_for(lambda: len(app.appends) == 2)
    assert app.appends[1] == [(b"d", b"d")] and acknowledged_later == []
    app.acks[1].set_result(SimpleNamespace(topic_partition="changelog-0", offset=3))
    await asyncio.gather(*second)
    assert acknowledged_later == ["d"]


async def test_a_changelog_that_fails_fails_every_input_and_acknowledges_none() -> None:
    app = _App()
    table, commits = _table(), Commits(cast(Any, app))
    outputs = asyncio.get_running_loop().create_future()
    tasks, acknowledged = await _inputs(commits, table, ["a", "b"], outputs)
    outputs.set_result(None)
    await wait_for(lambda: len(app.acks) == 1)
    app.acks[0].set_exception(RuntimeError("broker gone"))
    for task in tasks:
        with pytest.raises(RuntimeError, match="broker gone"):
            await task
    assert acknowledged == []
