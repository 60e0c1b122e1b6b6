"""SDK-style ``embed`` / ``upsert`` callables for the vector sink's tests: a dict as the index."""

from __future__ import annotations

import hashlib
from typing import Any

INDEX: dict[str, tuple[list[float], dict[str, Any]]] = {}


def embed(text: str) -> list[float]:  # sync, as the SDK allows
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255 for b in digest[:8]]


async def upsert(id: str, vector: list[float], meta: dict[str, Any]) -> None:
    INDEX[id] = (vector, meta)
