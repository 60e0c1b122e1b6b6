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


HOOKS: list[tuple[str, ...]] = []


def write_actions(session_id: str, text: str) -> None:
    pass


def overwrite_with_summary(session_id: str, summary: str) -> None:
    pass


def on_connect() -> None:
    HOOKS.append(("connect",))


async def on_disconnect(reason: str) -> None:
    HOOKS.append(("disconnect", reason))
