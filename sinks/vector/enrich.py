"""The SDK's ``ContextStore.enrich`` output, built from a session's current context.

``[Session context]`` then ``Summary: ...`` and ``Recent activity:`` (one
numbered line per action), then ``[Query]``; the query alone when there is no
context. Unlike the SDK's store, the activity is only the raw actions after
the summary's range (never a summarised action twice), numbered with the
session's sequence numbers in the SDK's ``[index]`` place (the numbers the
summary's range uses): ``1. [13] click: Export — https://...``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sinks.context import SessionContext
from sinks.vector.store import Hit

__all__ = ["enrich_text", "session_context_text"]

_NUMBERED = re.compile(r"^\[\d+\] ")


def _activity(context: SessionContext) -> list[str]:
    # A batch's lines are the SDK's Action.to_text() with the sequence number as index.
    actions = [
        line
        for batch in context.batches
        for line in batch.text.splitlines()
        if _NUMBERED.match(line)  # not each batch's "Session ... — actions a-b" header
    ]
    return [f"{n}. {line}" for n, line in enumerate(actions, start=1)]


def session_context_text(context: SessionContext, related: Sequence[Hit] = ()) -> str:
    """What goes between ``[Session context]`` and ``[Query]`` (empty: no context)."""
    summaries = []
    if context.previous is not None and context.previous.summary:
        summaries.append(f"(earlier visit) {context.previous.summary}")
    if context.summary:
        summaries.append(context.summary)
    parts = []
    if summaries:
        parts.append("Summary: " + "\n".join(summaries))
    if lines := _activity(context):
        parts.append("Recent activity:\n" + "\n".join(lines))
    if related:
        shown = [f"- ({hit.score:.2f}) {hit.meta.get('text', '')}" for hit in related]
        parts.append("Related sessions:\n" + "\n".join(shown))
    return "\n\n".join(parts)


def enrich_text(context: SessionContext, query: str, related: Sequence[Hit] = ()) -> str:
    text = session_context_text(context, related)
    return f"[Session context]\n{text}\n\n[Query]\n{query}" if text else query
