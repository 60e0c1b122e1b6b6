"""A sink's contexts table as ``ContextStore`` sees one in unit tests, with the writes
its saves return applied to it."""

from __future__ import annotations

from typing import Any

__all__ = ["DictTable", "apply_writes"]


class DictTable:
    """A table as ``streams._faust.stores.read`` sees one that is neither store it knows."""

    data = None

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def get(self, key: str) -> bytes | None:
        return self.values.get(key)


def apply_writes(table: DictTable, writes: list[Any]) -> None:
    """``(table, key, value)`` writes, in order: ``None`` deletes."""
    for _, key, value in writes:
        if value is None:
            table.values.pop(key, None)
        else:
            table.values[key] = value
