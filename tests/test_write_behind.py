"""``WriteBehind``'s crash-consistent order of a unit's writes (``_ordered``)."""

from __future__ import annotations

from typing import Any

from streams._faust.write_behind import WriteBehind


def order_of(key: str, value: bytes | None) -> int:
    """As the accumulator's: new batches, then session entries, then deletions."""
    if "/" in key:
        return 0 if value is not None else 2
    return 1


async def never(where: str, exc: BaseException) -> None:
    raise AssertionError(f"{where}: {exc}")


def ordered(writes: list[tuple[str, bytes | None]]) -> list[tuple[str, bytes | None]]:
    table: Any = object()
    unit = [(table, key, value, version) for version, (key, value) in enumerate(writes)]
    behind = WriteBehind(None, on_error=never, order_of=order_of)  # type: ignore[arg-type]
    return [(key, value) for _, key, value, _ in behind._ordered(unit)]


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
