"""The built-in default: LanceDB (embedded, under the data dir) and WordLlama embeddings.

Neither needs a server nor a download: wordllama 0.4 ships its 256-dimension
weights and tokenizer inside the package, loaded once per process.
Writes from all sessions' lanes are grouped into one LanceDB commit per round
(:class:`LanceStore` keeps a queue), because a commit per summary left
thousands of tiny fragments and made every query slower.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

from sinks.vector.store import Hit, Kind, VectorRecord

__all__ = ["LanceStore", "WordLlamaEmbedder", "load_wordllama"]

log = logging.getLogger(__name__)

WORDLLAMA_DIM = 256
COMPACT_EVERY_COMMITS = 200
_COLUMNS = ("session_id", "product_id", "user_id", "kind", "generation", "seq_from", "seq_to")


@functools.cache
def load_wordllama() -> Any:
    """The model, once per process, from the files inside the package (no network)."""
    import wordllama
    from wordllama import WordLlama

    return WordLlama.load(
        cache_dir=os.path.dirname(wordllama.__file__), disable_download=True, dim=WORDLLAMA_DIM
    )


class WordLlamaEmbedder:
    """``texts -> unit vectors`` (so the cosine similarity is the dot product)."""

    dim = WORDLLAMA_DIM

    def __init__(self) -> None:
        self._model = load_wordllama()

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        vectors = self._model.embed(texts, norm=True)
        return [v.tolist() for v in vectors]


def _quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


class LanceStore:
    """One LanceDB table of records; superseded records are deleted."""

    def __init__(self, uri: str | Path, table: str = "context_vectors") -> None:
        self._uri, self._name = str(uri), table
        self._db: Any = None
        self._table: Any = None
        self._pending: list[tuple[str, list[Any], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._commits = 0

    async def setup(self) -> None:
        import lancedb

        if "://" not in self._uri:
            Path(self._uri).mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (start-up)
        self._db = await asyncio.to_thread(lancedb.connect, self._uri)
        try:  # created by the first write (it knows the vectors' dimension)
            self._table = await asyncio.to_thread(self._db.open_table, self._name)
        except (ValueError, FileNotFoundError):
            self._table = None
        self._writer = asyncio.create_task(self._write_rounds(), name="lance-writer")

    async def aclose(self) -> None:
        if self._writer is not None:
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
            self._writer = None

    # ------------------------------------------------------------------ writes

    async def upsert(self, records: list[VectorRecord]) -> None:
        await self._submit("upsert", [self._row(r) for r in records])

    async def supersede(self, records: list[VectorRecord]) -> None:
        await self._submit("delete", [r.id for r in records])

    async def _submit(self, what: str, items: list[Any]) -> None:
        if not items:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((what, items, done))
        self._wake.set()
        await done

    async def _write_rounds(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            batch, self._pending = self._pending, []
            try:
                await asyncio.to_thread(self._commit, batch)
            except Exception as exc:  # each waiter retries through the runner
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, _, done in batch:
                if not done.done():
                    done.set_result(None)

    def _commit(self, batch: list[tuple[str, list[Any], asyncio.Future[None]]]) -> None:
        # In submission order, but one merge per run of upserts: a delete never
        # precedes the upsert of the summary that replaced it (same lane, earlier).
        rows: dict[str, dict[str, Any]] = {}
        for what, items, _ in batch:
            if what == "upsert":
                rows.update((row["id"], row) for row in items)
            else:
                self._flush_rows(rows)
                rows = {}
                ids = ", ".join(_quote(i) for i in items)
                if self._table is not None:
                    self._table.delete(f"id IN ({ids})")
        self._flush_rows(rows)
        self._commits += 1
        if self._commits % COMPACT_EVERY_COMMITS == 0 and self._table is not None:
            self._table.optimize(cleanup_older_than=timedelta(minutes=1))

    def _flush_rows(self, rows: dict[str, dict[str, Any]]) -> None:
        if not rows:
            return
        data = list(rows.values())
        if self._table is None:  # the first write: the vectors give the dimension
            self._table = self._db.create_table(self._name, data=data)
            return
        self._table.merge_insert(
            "id"
        ).when_matched_update_all().when_not_matched_insert_all().execute(data)

    @staticmethod
    def _row(record: VectorRecord) -> dict[str, Any]:
        meta = record.meta
        return {
            "id": record.id,
            "vector": record.vector,
            "text": record.text,
            "session_id": meta["session_id"],
            "product_id": meta.get("product_id") or "",
            "user_id": meta.get("user_id") or "",
            "kind": meta["kind"],
            "generation": int(meta["generation"]),
            "seq_from": int(meta["seq_from"]),
            "seq_to": int(meta["seq_to"]),
            "final": bool(meta.get("final", False)),
            "emitted_at": float(meta.get("emitted_at", 0.0)),
        }

    # ------------------------------------------------------------------ reads

    async def search(
        self, vector: list[float], *, k: int, product_id: str | None, kinds: tuple[Kind, ...]
    ) -> list[Hit]:
        if self._table is None:
            return []
        where = f"kind IN ({', '.join(_quote(k) for k in kinds)})"
        if product_id is not None:
            where += f" AND product_id = {_quote(product_id)}"
        rows = await asyncio.to_thread(self._search, vector, k, where)
        return [
            Hit(
                id=row["id"],
                score=1.0 - float(row["_distance"]),
                meta={name: row[name] for name in (*_COLUMNS, "text", "final", "emitted_at")},
            )
            for row in rows
        ]

    def _search(self, vector: list[float], k: int, where: str) -> list[dict[str, Any]]:
        query = self._table.search(vector).metric("cosine").where(where, prefilter=True)
        return query.select([*_COLUMNS, "id", "text", "final", "emitted_at"]).limit(k).to_list()  # type: ignore[no-any-return]

    async def count(self, where: str | None = None) -> int:
        if self._table is None:
            return 0
        return await asyncio.to_thread(self._table.count_rows, where)  # type: ignore[no-any-return]
