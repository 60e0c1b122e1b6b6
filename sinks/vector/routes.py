"""The vector sink's query API, on its worker's web port.

``GET /search?q=&product_id=&k=``: the most similar sessions' current summaries.
``GET /sessions/{id}/enrich?q=&product_id=&related=``: the SDK's ``enrich()`` text.
A ``product_id`` confines both to one tenant's sessions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from faust.web import Request, Response, View

from sinks.context import SessionContext
from sinks.vector.enrich import enrich_text
from sinks.vector.store import Hit, Kind
from streams.observe.web import unauthorized

if TYPE_CHECKING:
    from sinks.vector.sink import VectorSink

__all__ = ["add_routes", "search_sessions"]

MAX_K = 100


async def search_sessions(
    sink: VectorSink,
    query: str,
    *,
    k: int,
    product_id: str | None,
    kinds: tuple[Kind, ...] = ("summary",),
    exclude: str | None = None,
) -> list[Hit]:
    """The best hit per session, best first: a session with two visits counts once."""
    [vector] = await sink.embed([query])
    hits = await sink.store.search(vector, k=k * 3 + 1, product_id=product_id, kinds=kinds)
    best: dict[str, Hit] = {}
    for hit in hits:
        sid = hit.meta.get("session_id", "")
        if sid != exclude and sid not in best:
            best[sid] = hit
    return list(best.values())[:k]


def _int(request: Request, name: str, default: int, high: int) -> int:
    try:
        return max(0, min(int(request.query.get(name, default)), high))
    except ValueError:
        return default


def _hit_json(hit: Hit) -> dict[str, Any]:
    meta = hit.meta
    return {
        "session_id": meta.get("session_id"),
        "product_id": meta.get("product_id") or None,
        "user_id": meta.get("user_id") or None,
        "score": round(hit.score, 6),
        "summary": meta.get("text"),
        "kind": meta.get("kind"),
        "generation": meta.get("generation"),
        "seq_range": [meta.get("seq_from"), meta.get("seq_to")],
        "final": meta.get("final"),
        "emitted_at": meta.get("emitted_at"),
        "id": hit.id,
    }


def add_routes(
    app: Any, contexts: Any, load: Callable[[str], SessionContext], sink: VectorSink
) -> None:
    token = app.settings.api_token  # the pull view's access control (README "Access")

    @app.page("/search")
    async def search(web: View, request: Request) -> Response:
        if (refused := unauthorized(web, request, token)) is not None:
            return refused
        query = request.query.get("q", "").strip()
        if not query:
            return web.json({"error": "q is required"}, status=400)
        product_id = request.query.get("product_id") or None
        k = _int(request, "k", 5, MAX_K) or 5
        kinds: tuple[Kind, ...] = ("summary",)
        if request.query.get("batches") in ("1", "true"):
            kinds = ("summary", "actions")
        try:
            hits = await search_sessions(sink, query, k=k, product_id=product_id, kinds=kinds)
        except NotImplementedError as exc:
            return web.json({"error": str(exc)}, status=501)
        return web.json(
            {"query": query, "product_id": product_id, "results": [_hit_json(h) for h in hits]}
        )

    @app.page("/sessions/{session_id}/enrich")
    @app.table_route(table=contexts, match_info="session_id")
    async def enrich(web: View, request: Request, session_id: str) -> Response:
        if (refused := unauthorized(web, request, token)) is not None:
            return refused
        query = request.query.get("q", "")
        product_id = request.query.get("product_id") or None
        related_k = _int(request, "related", sink.related, 20)
        context = load(session_id) if contexts.get(session_id) is not None else None
        owner = (context.extra.get("vector") or {}).get("product_id") if context else None
        if context is None or (product_id is not None and owner != product_id):
            # Unknown here, or another tenant's: the SDK's answer without context.
            return web.json({"session_id": session_id, "text": query, "related": []})
        related: list[Hit] = []
        if related_k and query:
            related = await search_sessions(
                sink, query, k=related_k, product_id=owner, exclude=session_id
            )
        return web.json(
            {
                "session_id": session_id,
                "product_id": owner,
                "text": enrich_text(context, query, related),
                "related": [_hit_json(h) for h in related],
            }
        )
