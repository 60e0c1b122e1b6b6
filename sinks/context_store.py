"""Sink contexts in a table, with O(1) changelog bytes per operation.

A session's context is kept as a header (everything but the raw batches: the
summary, high-water marks, the sink's ``extra``) under the session id, and each
raw batch under ``batch_key(session, seq_from)``. Saving writes only what an
operation changed: a batch that follows the last one is written alone (loading
walks on from the header's range: the header holds the summary and ``extra``, and
rewriting it per batch was most of a save); anything else writes the header too,
and tombstones for the batches a summary now covers; the window is never rewritten whole.
``save`` and ``erase`` return the writes; the caller commits them with the
operation (``streams._faust.commit``: crash-safe order, then the input's ack).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import orjson
from faust.types import TableT
from pydantic import BaseModel

from schemas.ledger import SessionLedger
from sinks.context import Batch, SessionContext
from streams._faust import stores
from streams._faust.commit import Write
from streams.app import ContextApp
from streams.tables import batch_key

__all__ = ["ContextStore"]

# The header's fields that are models (the rest are plain JSON values).
_NESTED: dict[str, type[BaseModel]] = {"ledger": SessionLedger, "previous": SessionContext}


class ContextStore:
    """Loads and saves sessions' contexts; the ``cache_size`` most recently used
    are kept decoded.

    Loading a context read its header and each of its batches from the table
    and decoded them, for every operation (a fifth of the sink's CPU, found with
    py-spy). This store is the table's only writer, so a cached context is the
    table's content as long as this worker keeps its partitions: the cache is
    dropped whenever the consumer group's generation changes (a rebalance may
    move a partition away and back, with another worker's writes restored).
    Contexts are treated as immutable (``SessionContext.advanced`` copies).
    """

    def __init__(
        self,
        app: ContextApp,
        table: TableT[str, bytes],
        *,
        cache_size: int = 10_000,
        read: Callable[[TableT[str, bytes], str], bytes | None] | None = None,
    ) -> None:
        """``read``: how to read the table (a ``WriteBehind``'s ``get``: with the writes
        still pending); the store's values by default."""
        self._app, self._table = app, table
        self._get = read or stores.read
        self._cache: OrderedDict[str, SessionContext] = OrderedDict()
        # The JSON of a cached context's ledger and earlier visit, by session: they change
        # once per summary, and dumping them per operation was 9% of a sink (py-spy).
        self._nested: dict[tuple[str, str], tuple[BaseModel, orjson.Fragment]] = {}
        self._cache_size = cache_size
        self._generation: int | None = None

    def get(self, session_id: str) -> bytes | None:
        """The session's stored header, or None: with the writes still pending, so the
        pull view finds a context as soon as it is applied, as ``load`` does."""
        return self._get(self._table, session_id)

    def load(self, session_id: str) -> SessionContext:
        if self._generation != self._app.consumer_generation_id:
            self._cache.clear()
            self._nested.clear()
            self._generation = self._app.consumer_generation_id
        context = self._cache.get(session_id)
        if context is None:
            context = self._read(session_id)
            self._remember(context)
        else:
            self._cache.move_to_end(session_id)
        return context

    def _remember(self, context: SessionContext) -> None:
        self._cache[context.session_id] = context
        if len(self._cache) > self._cache_size:
            gone, _ = self._cache.popitem(last=False)
            self._forget_nested(gone)

    def _forget_nested(self, session_id: str) -> None:
        for name in _NESTED:
            self._nested.pop((session_id, name), None)

    def _nested_json(self, session_id: str, name: str, value: BaseModel) -> orjson.Fragment:
        """``value``'s JSON, dumped again only when it is another object (contexts are
        immutable: an unchanged ledger is the same object in the next context)."""
        cached = self._nested.get((session_id, name))
        if cached is not None and cached[0] is value:
            return cached[1]
        dumped = orjson.Fragment(orjson.dumps(value.model_dump(mode="json")))
        self._nested[(session_id, name)] = (value, dumped)
        return dumped

    def _read(self, session_id: str) -> SessionContext:
        raw = self._get(self._table, session_id)
        if raw is None:
            return SessionContext(session_id=session_id)
        header = orjson.loads(raw)
        stored_to, generation = header["actions_to"], header["generation"]
        seq = header.pop("first_batch", 0) or stored_to + 1
        batches = []
        while (stored := self._get(self._table, batch_key(session_id, seq))) is not None:
            fields = orjson.loads(stored)  # written by save() below
            # Past the header's range only a batch of its generation, written by save()
            # alone: a stale one (a crash before its tombstone) ends the window there.
            if fields.pop("generation", None if seq > stored_to else generation) != generation:
                break
            batch = Batch.model_construct(**fields)
            batches.append(batch)
            seq = batch.seq_to + 1
        if batches:
            header["actions_to"] = max(stored_to, batches[-1].seq_to)
        for name, model in _NESTED.items():  # written as JSON by save(): validate those back
            if header.get(name) is not None:
                header[name] = model.model_validate(header[name])
        return SessionContext.model_construct(**header, batches=batches)

    def save(self, before: SessionContext, after: SessionContext) -> list[Write]:
        """The writes from ``before`` to ``after``: new batches, the header, deletions of
        the batches it no longer lists (committed in that crash-safe order: a header
        whose first batch is gone lost every batch after it on load). At worst, batch
        entries nothing refers to any more stay behind (only after a crash)."""
        sid, table, generation = after.session_id, self._table, after.generation
        new, deleted = _changed_batches(before, after)
        writes: list[Write] = [
            (
                table,
                batch_key(sid, b.seq_from),
                orjson.dumps({**b.__dict__, "generation": generation}),
            )
            for b in new
        ]
        if not _appended_only(before, after, new, deleted):
            header = {k: v for k, v in after.__dict__.items() if k != "batches"}
            for name in _NESTED:
                if header[name] is not None:
                    header[name] = self._nested_json(sid, name, header[name])
            header["first_batch"] = after.batches[0].seq_from if after.batches else 0
            writes.append((table, sid, orjson.dumps(header)))
        writes += [(table, batch_key(sid, batch.seq_from), None) for batch in deleted]
        if self._generation == self._app.consumer_generation_id:
            self._remember(after)
        return writes

    def erase(self, context: SessionContext) -> list[Write]:
        """Tombstones for the session's header and each of its batches: nothing stays."""
        sid, table = context.session_id, self._table
        writes: list[Write] = [(table, batch_key(sid, b.seq_from), None) for b in context.batches]
        writes.append((table, sid, None))
        self._cache.pop(sid, None)
        self._forget_nested(sid)
        if self._generation == self._app.consumer_generation_id:
            # What the table holds once the tombstones are in: a later operation of the
            # session in the same inline batch must not load the erased context
            # (test_context.py: test_an_erased_context_is_not_loaded_before_its_tombstones_are_in).
            self._remember(SessionContext(session_id=sid))
        return writes


# What a header holds that a batch appended after the last one leaves as it was.
_HEADER_KEPT = tuple(
    name for name in SessionContext.model_fields if name not in ("batches", "actions_to")
)


def _appended_only(
    before: SessionContext, after: SessionContext, new: list[Batch], deleted: list[Batch]
) -> bool:
    """Whether ``after`` is ``before`` and one batch right after its last action: then the
    stored header stays as it is, and loading finds the batch by walking on from it. A
    session's first batch writes the header (the pull view answers 404 without one)."""
    if deleted or len(new) != 1 or not before.actions_to:
        return False
    if new[0].seq_from != before.actions_to + 1:
        return False  # a gap (an operation dead-lettered): the walk would stop at it
    old, now = before.__dict__, after.__dict__
    return all(old[k] is now[k] or old[k] == now[k] for k in _HEADER_KEPT)


def _changed_batches(
    before: SessionContext, after: SessionContext
) -> tuple[list[Batch], list[Batch]]:
    """The batches ``after`` added and the ones it dropped, in O(changes), not O(window).

    Within a generation ``after``'s batches are a suffix of ``before``'s (a summary
    drops a prefix) followed by new ones, all in ``seq_from`` order; a new
    generation replaces them all.
    """
    if before.generation != after.generation:
        overwritten = {b.seq_from for b in after.batches}  # same keys: no tombstone needed
        return list(after.batches), [b for b in before.batches if b.seq_from not in overwritten]
    old, now = before.batches, after.batches
    first_kept = now[0].seq_from if now else None
    dropped = 0
    while dropped < len(old) and (first_kept is None or old[dropped].seq_from < first_kept):
        dropped += 1
    last_old = old[-1].seq_from if old else -1
    added = len(now)
    while added > 0 and now[added - 1].seq_from > last_old:
        added -= 1
    return now[added:], old[:dropped]
