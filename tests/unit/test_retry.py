"""streams/retry.py: the first attempt outside tenacity, the rest under its policy."""

from __future__ import annotations

import pytest
from tenacity import RetryCallState

from streams.retry import retry_call, wait_hinted


class Flaky(Exception):
    pass


async def test_a_failed_first_attempt_is_tenacitys_attempt_one() -> None:
    calls: list[int] = []
    slept: list[int] = []

    async def fn() -> str:
        calls.append(len(calls) + 1)
        if len(calls) < 3:
            raise Flaky
        return "done"

    def log(state: RetryCallState) -> None:
        slept.append(state.attempt_number)

    result = await retry_call(
        fn, retry=lambda e: isinstance(e, Flaky), wait=lambda s: 0.0, before_sleep=log
    )
    assert result == "done"
    assert calls == [1, 2, 3]  # the bare attempt's failure was not called again
    assert slept == [1, 2]  # numbered as if tenacity had made every attempt


async def test_attempts_bound_the_calls_and_other_errors_are_not_retried() -> None:
    calls = 0

    async def fn() -> None:
        nonlocal calls
        calls += 1
        raise Flaky if calls < 10 else ValueError

    with pytest.raises(Flaky):
        await retry_call(fn, retry=lambda e: isinstance(e, Flaky), wait=lambda s: 0, attempts=3)
    assert calls == 3
    calls = 9
    with pytest.raises(ValueError):
        await retry_call(fn, retry=lambda e: isinstance(e, Flaky), wait=lambda s: 0, attempts=3)
    assert calls == 10


async def test_the_wait_is_never_shorter_than_the_server_asked() -> None:
    waits: list[float] = []
    asked = iter([None, 7.0])

    async def fn() -> None:
        if len(waits) < 2:
            raise Flaky

    def base(state: RetryCallState) -> float:
        return 1.0

    wait = wait_hinted(base, lambda error: next(asked))

    def record(state: RetryCallState) -> float:
        waits.append(wait(state))
        return 0.0

    await retry_call(fn, retry=lambda e: isinstance(e, Flaky), wait=record)
    assert waits == [1.0, 7.0]
