"""Dataclasses that a stage keeps in its table as JSON bytes."""

from __future__ import annotations

from typing import Self

import orjson

__all__ = ["JsonRecord"]


class JsonRecord:
    """Base of a dataclass stored as JSON: orjson encodes dataclasses natively (no
    ``asdict`` deep copy), and the fields come back as keyword arguments."""

    __slots__ = ()

    def to_bytes(self) -> bytes:
        return orjson.dumps(self)

    @classmethod
    def from_bytes(cls, raw: bytes) -> Self:
        return cls(**orjson.loads(raw))
