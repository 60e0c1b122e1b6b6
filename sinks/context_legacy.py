"""Contexts stored before slots (``sinks.context_store``'s layout): read as they were.

Such a header lists its batches from ``first_batch``, each under
``batch_key(session, seq_from)``. The store moves them inline at the context's next save,
which deletes their keys (tests/unit/test_context.py, "before slots").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from sinks.context import Batch
from streams.tables import batch_key

__all__ = ["legacy_batches"]


def legacy_batches(
    read: Callable[[str], bytes | None], session_id: str, header: dict[str, Any]
) -> list[Batch]:
    """The batches of a header stored before slots, read with ``read(key)``; ``header``
    is left as a slotted one reads (its ``actions_to`` through the last batch found)."""
    stored_to, generation = header["actions_to"], header["generation"]
    seq = header.pop("first_batch", 0) or stored_to + 1
    batches = []
    while (stored := read(batch_key(session_id, seq))) is not None:
        fields = orjson.loads(stored)
        # Past the header's range only a batch of its generation, written by save()
        # alone: a stale one (a crash before its tombstone) ends the window there.
        if fields.pop("generation", None if seq > stored_to else generation) != generation:
            break
        batch = Batch(**fields)
        batches.append(batch)
        seq = batch.seq_to + 1
    if batches:
        header["actions_to"] = max(stored_to, batches[-1].seq_to)
    return batches
