"""Per-session lanes: order per key, and what happens when a handler raises."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from streams.lanes import LaneFailed, Lanes
from tests.support.waiting import wait_for


async def test_a_raising_handler_stops_the_lanes_and_reports_the_key() -> None:
    handled: list[tuple[str, int]] = []
    errors: list[tuple[str, BaseException]] = []
    release = asyncio.Event()

    async def handler(key: str, item: int) -> None:
        if key == "slow":
            await release.wait()
        if (key, item) == ("bad", 2):
            raise KeyError("a bug")
        handled.append((key, item))

    async def on_error(key: str, exc: BaseException) -> None:
        errors.append((key, exc))

    lanes: Lanes[int] = Lanes(handler, on_error=on_error)
    for item in (1, 2, 3):
        await lanes.submit("bad", item)
    await lanes.submit("slow", 1)
    await wait_for(lambda: errors, timeout=5, message="on_error not called")

    assert [(key, type(exc)) for key, exc in errors] == [("bad", KeyError)]
    assert ("bad", 3) not in handled  # nothing of that key runs after the failed item
    with pytest.raises(LaneFailed, match="lane 'bad': KeyError") as failed:
        await lanes.submit("other", 1)  # no more work is taken at all
    assert isinstance(failed.value.__cause__, KeyError)
    release.set()  # work already taken for other keys still finishes
    await asyncio.wait_for(lanes.join(), 5)
    assert handled == [("bad", 1), ("slow", 1)]


async def test_without_on_error_the_failure_still_stops_the_lanes() -> None:
    async def handler(key: str, item: int) -> None:
        raise ValueError("a bug")

    lanes: Lanes[int] = Lanes(handler)
    await lanes.submit("s", 1)
    await asyncio.wait_for(lanes.join(), 5)
    with pytest.raises(LaneFailed):
        await lanes.submit("s", 2)


async def test_order_per_key_and_concurrency_across_keys() -> None:
    running: set[str] = set()
    overlap = 0
    seen: dict[str, list[int]] = {}

    async def handler(key: str, item: int) -> None:
        nonlocal overlap
        running.add(key)
        overlap = max(overlap, len(running))
        await asyncio.sleep(0)  # yield, so other lanes get to run in between
        seen.setdefault(key, []).append(item)
        running.discard(key)

    lanes: Lanes[int] = Lanes(handler, max_pending=5)
    for item in range(20):
        for key in ("a", "b", "c"):
            await lanes.submit(key, item)
    await asyncio.wait_for(lanes.join(), 5)
    assert seen == {key: list(range(20)) for key in ("a", "b", "c")}
    assert overlap > 1


async def test_an_item_in_progress_shows_with_its_stage_until_it_finishes() -> None:
    release = asyncio.Event()
    finished: list[str] = []

    async def handler(key: str, item: int) -> None:
        if key == "stuck":
            lanes.mark(key, "waiting for the destination")
            await release.wait()
        finished.append(key)

    lanes: Lanes[int] = Lanes(handler)
    await lanes.submit("stuck", 1)
    await lanes.submit("fast", 1)
    await wait_for(lambda: finished == ["fast"], timeout=5, message=str(finished))

    busy = lanes.in_progress()
    assert [(key, stage) for key, _, stage in busy] == [("stuck", "waiting for the destination")]
    assert 0.0 <= busy[0][1] < 3600.0
    release.set()
    await asyncio.wait_for(lanes.join(), 5)
    assert lanes.in_progress() == []


async def test_work_outside_the_lanes_shows_in_progress_and_marks_of_other_keys_leave_nothing() -> (
    None
):
    """A sink's inline batch is reported as a lane's item would be; ``mark`` for a key that
    has no item in progress (an inline operation) keeps nothing, so nothing grows."""

    async def handler(key: str, item: int) -> None:
        return None

    lanes: Lanes[int] = Lanes(handler)
    lanes.mark("session-1", "delivering actions_written")
    assert lanes.in_progress() == []
    lanes.begin_outside("(inline batch)", "applying 3 records")
    lanes.mark("(inline batch)", "waiting for its changelog records")
    [(key, _, stage)] = lanes.in_progress()
    assert (key, stage) == ("(inline batch)", "waiting for its changelog records")
    lanes.end_outside("(inline batch)")
    assert lanes.in_progress() == []
    assert not lanes._stage


async def test_lanes_reuse_their_workers_instead_of_a_task_per_activation() -> None:
    """A lane's activation took a task of its own (~2 µs more a summarize request,
    in-process): workers now wait for the next ready lane, one per lane active at once,
    and ``close`` stops them."""
    created = 0
    loop = asyncio.get_running_loop()
    factory = loop.get_task_factory()

    def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
        nonlocal created
        created += coro.__qualname__ in ("Lanes._work", "Lanes._drain")  # a lane's, old or new
        return asyncio.Task(coro, loop=loop, **kwargs)

    release = asyncio.Event()

    async def handler(key: str, item: int) -> None:
        if key.startswith("held"):
            await release.wait()

    lanes: Lanes[int] = Lanes(handler)
    loop.set_task_factory(counting)
    try:
        for n in range(50):  # one lane after another: one worker does them all
            await lanes.submit(f"s{n}", n)
            await asyncio.wait_for(lanes.join(), 5)
        assert created == 1
        for n in range(3):  # three lanes at once: three workers
            await lanes.submit(f"held{n}", n)
        await wait_for(lambda: lanes.active_keys == 3 and len(lanes.in_progress()) == 3, timeout=5)
        assert created == 3
    finally:
        loop.set_task_factory(factory)
    await lanes.close()
    assert lanes.active_keys == 0 and lanes.in_progress() == []
    await asyncio.wait_for(lanes.join(), 5)
