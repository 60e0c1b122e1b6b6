"""The bench's machine-wide figures: what the cores did between two readings."""

from __future__ import annotations

from scripts.bench.measure import machine_shares, machine_ticks


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
