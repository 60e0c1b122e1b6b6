"""What the vector sink stores, and the store contract a backend implements.

A record is one summary (or, optionally, one raw batch) of one session, keyed
by a hash of (session, generation, kind, seq range): a redelivery upserts the
same id, so it overwrites instead of adding. The SDK's ``embed(text)`` and
``upsert(id, vector, meta)`` plug in unchanged through :class:`CallbackStore`.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from streams.hooks import Hook, call

__all__ = [
    "CallbackStore",
    "Embedder",
    "Hit",
    "Kind",
    "VectorRecord",
    "VectorStore",
    "record_id",
]

Kind = Literal["summary", "actions"]


def record_id(session_id: str, generation: int, kind: Kind, seq_from: int, seq_to: int) -> str:
    """Deterministic: the same operation delivered twice gets the same id."""
    key = f"{session_id}\x1f{generation}\x1f{kind}\x1f{seq_from}\x1f{seq_to}"
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass
class VectorRecord:
    id: str
    text: str
    meta: dict[str, Any]  # session_id, product_id, user_id, generation, seq range, ...
    vector: list[float] = field(default_factory=list)


@dataclass
class Hit:
    id: str
    score: float  # cosine similarity, higher is closer
    meta: dict[str, Any]


class Embedder(Protocol):
    async def __call__(self, texts: list[str]) -> list[list[float]]: ...


@runtime_checkable
class VectorStore(Protocol):
    async def upsert(self, records: list[VectorRecord]) -> None:
        """Insert or overwrite by ``id``."""
        ...

    async def supersede(self, records: list[VectorRecord]) -> None:
        """These records were replaced by a newer summary: never return them again."""
        ...

    async def search(
        self, vector: list[float], *, k: int, product_id: str | None, kinds: tuple[Kind, ...]
    ) -> list[Hit]:
        """Up to ``k`` current records, best first, of one product when it is given."""
        ...


class CallbackStore:
    """The SDK's ``upsert(id, vector, meta)`` (sync or async), with an optional
    ``delete(id)`` and ``query(vector, k, filter) -> [(id, score, meta)]``.

    Without ``delete`` a superseded record is upserted again under its id with
    ``superseded: True`` in its meta, so a user's query can filter on it.
    """

    def __init__(
        self,
        upsert: Hook,
        *,
        delete: Hook | None = None,
        query: Hook | None = None,
    ) -> None:
        self._upsert, self._delete, self._query = upsert, delete, query
        # Marking a record superseded re-upserts it, which needs its vector again.
        self.needs_vectors_to_supersede = delete is None

    async def upsert(self, records: list[VectorRecord]) -> None:
        for record in records:
            await call(self._upsert, record.id, record.vector, record.meta)

    async def supersede(self, records: list[VectorRecord]) -> None:
        for record in records:
            if self._delete is not None:
                await call(self._delete, record.id)
            else:
                meta = {**record.meta, "superseded": True}
                await call(self._upsert, record.id, record.vector, meta)

    async def search(
        self, vector: list[float], *, k: int, product_id: str | None, kinds: tuple[Kind, ...]
    ) -> list[Hit]:
        if self._query is None:
            raise NotImplementedError("no AC_VECTOR_QUERY callable: this store cannot be searched")
        where: dict[str, Any] = {"kind": list(kinds), "superseded": False}
        if product_id is not None:
            where["product_id"] = product_id
        rows = await call(self._query, vector, k, where)
        return [Hit(id=str(i), score=float(s), meta=dict(m)) for i, s, m in rows]
