"""Dataclasses that a stage keeps in its table as JSON bytes."""

from __future__ import annotations

from dataclasses import fields
from typing import Self

import orjson

__all__ = ["JsonRecord"]

_names: dict[type, frozenset[str]] = {}


class JsonRecord:
    """Base of a dataclass stored as JSON: orjson encodes dataclasses natively (no
    ``asdict`` deep copy), and the fields come back as keyword arguments."""

    __slots__ = ()

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> Self:
        data = orjson.loads(raw)
        names = _names.get(cls)
        if names is None:
            names = _names[cls] = frozenset(f.name for f in fields(cls))  # type: ignore[arg-type]
        if data.keys() == names:  # every field and no other: what __init__ would set, at half
            record = cls.__new__(cls)  # the cost (tests/unit/test_session_state.py, old entries)
            record.__dict__ = data  # type: ignore[misc]
            return record
        # A field an older version kept and this one does not (a session entry's ledger,
        # before session 21) is left out: test_an_upgraded_worker_reads_the_old_changelogs_entries.
        return cls(**{name: value for name, value in data.items() if name in names})
