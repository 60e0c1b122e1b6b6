"""The pull side: summaries embedded into a vector store, searched and used to enrich
an agent's query (``AC_SINK=vector``; docs/sinks.md#vector)."""

from sinks.vector.enrich import enrich_text, session_context_text
from sinks.vector.lance import LanceStore, WordLlamaEmbedder, load_wordllama
from sinks.vector.routes import search_sessions
from sinks.vector.sink import CallableEmbedder, VectorSettings, VectorSink
from sinks.vector.store import CallbackStore, Embedder, Hit, VectorRecord, VectorStore, record_id

__all__ = [
    "CallableEmbedder",
    "CallbackStore",
    "Embedder",
    "Hit",
    "LanceStore",
    "VectorRecord",
    "VectorSettings",
    "VectorSink",
    "VectorStore",
    "WordLlamaEmbedder",
    "enrich_text",
    "load_wordllama",
    "record_id",
    "search_sessions",
    "session_context_text",
]
