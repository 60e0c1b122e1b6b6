"""The vector sink: each session's current summary embedded and upserted into a store.

``AC_SINK=vector``. By default LanceDB under the data dir with WordLlama
embeddings; the SDK's ``embed(text)`` and ``upsert(id, vector, meta)`` (sync or
async) replace either by dotted path. Bookkeeping in ``context.extra["vector"]``
(the ids stored per generation) lets a summary supersede what it replaces.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import ActionsWritten, SummaryReady
from sinks.base import Operation, Sink
from sinks.context import SessionContext
from sinks.vector.lance import LanceStore, WordLlamaEmbedder
from sinks.vector.store import CallbackStore, Embedder, Kind, VectorRecord, VectorStore, record_id
from streams.hooks import Hook, call, fire, load_callable
from streams.settings import Settings

__all__ = ["CallableEmbedder", "VectorSettings", "VectorSink"]

log = logging.getLogger(__name__)

BOOK = "vector"  # the key of this sink's bookkeeping in context.extra


class VectorSettings(BaseSettings):
    """``AC_VECTOR_*``; every callable is a dotted path, sync or async."""

    model_config = SettingsConfigDict(env_prefix="AC_VECTOR_", extra="ignore")

    embed: str | None = None  # embed(text) -> list[float]; default WordLlama (256 dims)
    upsert: str | None = None  # upsert(id, vector, meta); default LanceDB
    delete: str | None = None  # delete(id), with upsert; else superseded records are flagged
    query: str | None = None  # query(vector, k, filter) -> [(id, score, meta)], with upsert
    uri: str | None = None  # LanceDB URI; default <AC_DATA_DIR>/vector
    table: str = "context_vectors"
    embed_batches: bool = False  # also embed each raw batch until a summary covers it
    related: int = Field(default=0, ge=0, le=20)  # related summaries enrich adds by default
    on_connect: str | None = None
    on_disconnect: str | None = None


class CallableEmbedder:
    """The SDK's ``embed(text) -> list[float]`` as an :class:`Embedder`."""

    def __init__(self, embed: Hook) -> None:
        self._embed = embed

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        return [[float(x) for x in await call(self._embed, text)] for text in texts]


class VectorSink(Sink):
    name = "vector"

    def __init__(
        self,
        store: VectorStore,
        embed: Embedder,
        *,
        embed_batches: bool = False,
        related: int = 0,
        on_connect: Hook | None = None,
        on_disconnect: Hook | None = None,
    ) -> None:
        self.store, self.embed = store, embed
        self.embed_batches, self.related = embed_batches, related
        self._on_connect, self._on_disconnect = on_connect, on_disconnect

    @classmethod
    def from_settings(cls, settings: Settings) -> VectorSink:
        vs = VectorSettings()
        embed_fn = load_callable(vs.embed, "AC_VECTOR_EMBED")
        upsert_fn = load_callable(vs.upsert, "AC_VECTOR_UPSERT")
        store: VectorStore
        if upsert_fn is not None:
            store = CallbackStore(
                upsert_fn,
                delete=load_callable(vs.delete, "AC_VECTOR_DELETE"),
                query=load_callable(vs.query, "AC_VECTOR_QUERY"),
            )
        else:
            store = LanceStore(vs.uri or Path(settings.data_dir) / "vector", vs.table)
        return cls(
            store,
            CallableEmbedder(embed_fn) if embed_fn is not None else WordLlamaEmbedder(),
            embed_batches=vs.embed_batches,
            related=vs.related,
            on_connect=load_callable(vs.on_connect, "AC_VECTOR_ON_CONNECT"),
            on_disconnect=load_callable(vs.on_disconnect, "AC_VECTOR_ON_DISCONNECT"),
        )

    # ------------------------------------------------------------------ lifecycle

    async def setup(self) -> None:
        if callable(setup := getattr(self.store, "setup", None)):
            await setup()
        await fire(self._on_connect, "vector on_connect")

    async def aclose(self) -> None:
        await fire(self._on_disconnect, "vector on_disconnect", "stopped")
        if callable(aclose := getattr(self.store, "aclose", None)):
            await aclose()

    def add_routes(self, app: Any, contexts: Any, load: Any) -> None:
        from sinks.vector.routes import add_routes

        add_routes(app, contexts, load, self)

    # ------------------------------------------------------------------ operations

    async def erase(self, session_id: str, context: SessionContext) -> None:
        """Every record this sink holds for the session goes (superseded: never returned)."""
        book: dict[str, Any] = context.extra.get(BOOK, {})
        refs = [
            ref
            for key, gen in book.items()
            if key.isdigit()
            for ref in [gen["summary"], *gen["batches"]]
            if ref
        ]
        stale = [VectorRecord(id=r["id"], text=r.get("text", ""), meta=r["meta"]) for r in refs]
        if stale and getattr(self.store, "needs_vectors_to_supersede", False):
            for item, vector in zip(stale, await self.embed([r.text for r in stale]), strict=True):
                item.vector = vector
        if stale:
            await self.store.supersede(stale)

    async def apply(self, op: Operation, context: SessionContext) -> None:
        book: dict[str, Any] = context.extra.setdefault(BOOK, {})
        if op.product_id:
            book["product_id"] = op.product_id
        if isinstance(op, ActionsWritten) and op.payload.user_id:
            book["user_id"] = op.payload.user_id
        gen = book.setdefault(str(op.generation), {"summary": None, "batches": []})
        if isinstance(op, ActionsWritten):
            if self.embed_batches:
                record = self._record(op, book, "actions", op.text, op.seq_from)
                await self._upsert(record)
                gen["batches"].append(self._ref(record))
        else:
            await self._apply_summary(op, book, gen)
        self._forget_old_generations(book, context)

    async def _apply_summary(
        self, op: SummaryReady, book: dict[str, Any], gen: dict[str, Any]
    ) -> None:
        record = self._record(op, book, "summary", op.summary, op.seq_from)
        await self._upsert(record)  # the new one first: a reader never finds none
        old = [gen["summary"]] if gen["summary"] and gen["summary"]["id"] != record.id else []
        old += [b for b in gen["batches"] if b["meta"]["seq_to"] <= op.seq_to]
        if old:
            stale = [VectorRecord(id=r["id"], text=r.get("text", ""), meta=r["meta"]) for r in old]
            if getattr(self.store, "needs_vectors_to_supersede", False):
                for item, vector in zip(
                    stale, await self.embed([r.text for r in stale]), strict=True
                ):
                    item.vector = vector
            await self.store.supersede(stale)
        gen["summary"] = self._ref(record)
        gen["batches"] = [b for b in gen["batches"] if b["meta"]["seq_to"] > op.seq_to]

    async def _upsert(self, record: VectorRecord) -> None:
        [record.vector] = await self.embed([record.text])
        await self.store.upsert([record])

    @staticmethod
    def _record(
        op: Operation, book: dict[str, Any], kind: Kind, text: str, seq_from: int
    ) -> VectorRecord:
        meta = {
            "type": kind,  # the SDK's ingest names it so
            "kind": kind,
            "session_id": op.session_id,
            "product_id": book.get("product_id", ""),
            "user_id": book.get("user_id", ""),
            "generation": op.generation,
            "seq_from": seq_from,
            "seq_to": op.seq_to,
            "final": isinstance(op, SummaryReady) and op.final,
            "emitted_at": op.emitted_at,
            "superseded": False,
        }
        rid = record_id(op.session_id, op.generation, kind, seq_from, op.seq_to)
        return VectorRecord(id=rid, text=text, meta=meta)

    def _ref(self, record: VectorRecord) -> dict[str, Any]:
        # The text only when superseding re-upserts (bounded: summaries are capped).
        ref = {"id": record.id, "meta": record.meta}
        if getattr(self.store, "needs_vectors_to_supersede", False):
            ref["text"] = record.text
        return ref

    @staticmethod
    def _forget_old_generations(book: dict[str, Any], context: SessionContext) -> None:
        keep = {str(context.generation)}
        if context.previous is not None:
            keep.add(str(context.previous.generation))
        for key in [k for k in book if k.isdigit() and k not in keep]:
            del book[key]
