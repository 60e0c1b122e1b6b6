"""The bench's measuring: what the cores did between two readings, how often it polls a worker."""

from __future__ import annotations

from scripts.bench.measure import machine_shares, machine_ticks, poll_interval


def test_the_shares_are_of_the_ticks_between_the_two_readings() -> None:
    assert machine_shares((100, 10, 1_000), (600, 60, 2_000)) == {
        "machine_busy": 0.5,
        "machine_steal": 0.05,
    }


def test_this_machines_ticks_add_up() -> None:
    busy, steal, total = machine_ticks()
    assert 0 < busy <= total and 0 <= steal <= total - busy
    later = machine_ticks()
    assert all(b >= a for a, b in zip((busy, steal, total), later, strict=True))


def test_a_worker_is_polled_often_only_near_the_end() -> None:
    # 1,000 done a second: 10 s to go is a 500 ms poll, 1 s to go 250 ms, 0.1 s to go 50 ms.
    assert poll_interval(done=5_000, elapsed_s=5, remaining=10_000) == 0.5
    assert poll_interval(done=5_000, elapsed_s=5, remaining=1_000) == 0.25
    assert poll_interval(done=5_000, elapsed_s=5, remaining=100) == 0.05
    assert poll_interval(done=0, elapsed_s=5, remaining=100) == 0.05  # no rate yet
