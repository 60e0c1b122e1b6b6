"""The crash-safe order of a unit's writes (``streams._faust.commit.crash_safe_order``)."""

from __future__ import annotations

from typing import Any

from streams._faust.commit import crash_safe_order, session_rank
from streams.tables import batch_key


def order_of(key: str, value: bytes | None) -> int:
    """As the accumulator's: new batches, then session entries, then deletions."""
    if "/" in key:
        return 0 if value is not None else 2
    return 1


def ordered(writes: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    table: Any = object()
    unit = [(table, key, value) for key, value in writes]
    return [(key, value) for _, key, value in crash_safe_order(unit, order_of)]


def test_new_entries_then_what_refers_to_them_then_deletions_each_in_write_order() -> None:
    writes = [
        ("a", b"a1"),
        ("a/0", None),
        ("a/2", b"batch"),
        ("b", b"b1"),
        ("b/5", b"batch"),
        ("a/1", None),
    ]
    assert ordered(writes) == [
        ("a/2", b"batch"),
        ("b/5", b"batch"),
        ("a", b"a1"),
        ("b", b"b1"),
        ("a/0", None),
        ("a/1", None),
    ]


def test_a_key_whose_writes_would_swap_keeps_the_units_own_order() -> None:
    writes = [("a/0", None), ("a", b"a1"), ("a/0", b"again")]  # deleted, then written anew
    assert ordered(writes) == writes


def test_one_rank_is_returned_as_it_is() -> None:
    writes = [("a", b"1"), ("b", b"2"), ("a", b"3")]
    assert ordered(writes) == writes


def test_the_session_rank_is_that_order_over_batch_keys() -> None:
    assert [session_rank(k, v) for k, v in [(batch_key("a", 1), b"x"), ("a", b"s")]] == [0, 1]
    assert session_rank(batch_key("a", 1), None) == 2
