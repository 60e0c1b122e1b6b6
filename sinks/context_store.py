"""Sink contexts in a table, with O(1) changelog records per operation.

A session's context is stored as a header under the session id (everything but the raw
batches kept in slots: the summary, high-water marks, the sink's ``extra``, and the
batches the last summary left, inline) and its later raw batches in slots,
``batch_key(session, "s<n>")``, numbered from 0 again after each summary. ``save``
writes what an operation changed, in one of three ways:

1. A batch right after the last one: its slot alone. Loading walks on from the
   header's slots while the next slot holds the batch that follows, of its generation.
2. A summary, a new generation or the close: the header alone, with the batches that
   remain inline and no slot in use; the next batches overwrite the slots from 0, so a
   summary writes no tombstone. The close deletes the slots the session used.
3. Anything else (the sink's ``extra``, a gap in the numbers): the new batches in the
   next slots, then the header.

A sink that delivers nothing (``Sink.delivers``: the null sink, whose agents read the pull
view) takes way 1 through ``append_run``, from the operations' bytes (``sinks.context_heads``,
compiled where built): no model, no context built per batch; the batches are added to the
cached context when it is next loaded.

Each save's writes are in crash-safe order (slots, the header that lists them, then
deletions); ``save`` and ``erase`` return them, and the caller commits them with the
operation, logged in the order they were made (``streams._faust.commit``): a slot is
overwritten only after the header that let go of it.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import msgspec
import orjson
from faust.types import TableT

from sinks.context import Batch, SessionContext
from sinks.context_heads import Appended, Slot, heads, slot_key
from sinks.context_legacy import legacy_batches
from streams._faust import stores
from streams._faust.commit import Write
from streams.app import ContextApp
from streams.tables import batch_key

__all__ = ["ContextStore"]

# The header's nested fields (the rest are plain JSON values): the ledger and the earlier
# visit, each dumped once per value (``ContextStore._nested_json``).
_NESTED = ("ledger", "previous")
_FIELDS = frozenset(SessionContext.__struct_fields__)


class _Layout(NamedTuple):
    """Where a context's batches are stored."""

    inline: int  # the window's first ``inline`` batches are in the header, the rest in slots
    used: int  # slots written since the close (each deleted at the next close or erasure)
    legacy: tuple[int, ...] = ()  # a context stored before slots: its batches' keys


_FRESH = _Layout(0, 0)
_NONE = Appended(0, [], [], ([], [], []))


_encode = msgspec.json.Encoder().encode

# A header: the context's fields but its batches, in order, then where its batches are; the
# bytes orjson wrote from a dict of them (a float's exponent without "+"; the golden file).
_HEADER_FIELDS = tuple(name for name in SessionContext.__struct_fields__ if name != "batches")
_HeaderRecord = msgspec.defstruct(
    "_HeaderRecord",
    [(name, Any) for name in (*_HEADER_FIELDS, "inline", "slots", "slots_used")],
    gc=False,
)
_header_values = operator.attrgetter(*_HEADER_FIELDS)
_NESTED_AT = tuple(_HEADER_FIELDS.index(name) for name in _NESTED)


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
        compiled: bool = True,
        read: Callable[[TableT[str, bytes], str], bytes | None] | None = None,
        decoded: Callable[[], object] | None = None,
    ) -> None:
        """``read``: how to read the table (a ``WriteBehind``'s ``get``: with the writes
        still pending); the store's values by default. ``decoded``: called for each stored
        context decoded from the table (a counter's ``inc``): the cache's misses.
        ``compiled``: ``append_run`` by ``native/`` where built (``AC_COMPILED``)."""
        self._app, self._table = app, table
        self._get = read or stores.read
        self._cache: OrderedDict[str, tuple[SessionContext, _Layout]] = OrderedDict()
        # The JSON of a cached context's ledger and earlier visit, by session: they change
        # once per summary, and dumping them per operation was 9% of a sink (py-spy).
        self._nested: dict[tuple[str, str], tuple[Any, msgspec.Raw]] = {}
        self._cache_size = cache_size
        self._decoded = decoded or (lambda: None)
        self._generation: int | None = None
        # The cached contexts that may take appends, with the batches ``append_run`` stored
        # after them, added to them by ``load``: armed and disarmed with the cache.
        self._heads = heads(compiled=compiled)

    def get(self, session_id: str) -> bytes | None:
        """The session's stored header, or None: with the writes still pending, so the
        pull view finds a context as soon as it is applied, as ``load`` does."""
        return self._get(self._table, session_id)

    def _current(self) -> None:
        """Called before the cache is read: dropped when the consumer group's generation
        changed (a partition may come back with another worker's writes)."""
        if self._generation != self._app.consumer_generation_id:
            self._cache.clear()
            self._nested.clear()
            self._heads.clear()
            self._generation = self._app.consumer_generation_id

    def load(self, session_id: str) -> SessionContext:
        self._current()
        cached = self._cache.get(session_id)
        if cached is None:
            cached = self._read(session_id)
            self._remember(*cached)
        else:
            self._cache.move_to_end(session_id)
            if (taken := self._heads.take(session_id)) is not None:
                appended, used = taken
                context = msgspec.structs.replace(
                    cached[0],
                    actions_to=appended[-1][1],
                    batches=[
                        *cached[0].batches,
                        *(Batch(seq_from=a, seq_to=b, text=text) for a, b, text in appended),
                    ],
                )
                layout = _Layout(cached[1].inline, used)
                cached = self._cache[session_id] = (context, layout)
        return cached[0]

    def append_run(self, values: list[bytes | None], start: int, now: float) -> Appended:
        """Way 1 from the operations' bytes, for a sink that delivers nothing: ``values[start:]``
        stored while each is a batch right after its cached context's last, of its
        generation, and not the session's first (which writes the header), by its slot's
        record alone (``sinks.context_heads``); the first that is not is left to ``load``,
        ``advanced`` and ``save``. The same records and the same loaded contexts as they
        (test_context_append.py). ``now``: when the batches' ages are taken."""
        if self._generation != self._app.consumer_generation_id:
            return _NONE  # load() drops the cache first
        return Appended(*self._heads.append(values, start, now))

    def _remember(self, context: SessionContext, layout: _Layout) -> None:
        sid = context.session_id
        self._cache[sid] = (context, layout)
        if context.actions_to and not context.closed and not layout.legacy:
            slot = len(context.batches) - layout.inline
            self._heads.arm(sid, context.generation, context.actions_to, slot, layout.used)
        else:
            self._heads.disarm(sid)
        if len(self._cache) > self._cache_size:
            gone, _ = self._cache.popitem(last=False)
            self._forget_nested(gone)
            self._heads.disarm(gone)  # its appends are stored: a later load reads them back

    def _layout(self, context: SessionContext) -> _Layout:
        """How ``context`` is stored: known if it is the one cached, else read (the cache
        let it go, or a rebalance dropped it, while its operation was at the sink)."""
        cached = self._cache.get(context.session_id)
        if cached is not None and cached[0] is context:
            return cached[1]
        return self._read(context.session_id)[1]

    def _forget_nested(self, session_id: str) -> None:
        for name in _NESTED:
            self._nested.pop((session_id, name), None)

    def _nested_json(self, session_id: str, name: str, value: Any) -> msgspec.Raw:
        """``value``'s JSON, dumped again only when it is another object (contexts are
        immutable: an unchanged ledger is the same object in the next context)."""
        cached = self._nested.get((session_id, name))
        if cached is not None and cached[0] is value:
            return cached[1]
        # msgspec writes the numbers orjson writes (an exponent without its "+"): 1.8 µs
        # against 10.4 a ledger when it was a pydantic model (test_context.py's golden file).
        dumped = msgspec.Raw(_encode(value))
        self._nested[(session_id, name)] = (value, dumped)
        return dumped

    def _read(self, session_id: str) -> tuple[SessionContext, _Layout]:
        raw = self._get(self._table, session_id)
        if raw is None:
            return SessionContext(session_id=session_id), _FRESH
        self._decoded()
        header = orjson.loads(raw)
        if "slots" not in header:  # stored before slots: sinks/context_legacy.py
            table = self._table
            batches = legacy_batches(lambda key: self._get(table, key), session_id, header)
            legacy = tuple(b.seq_from for b in batches)
            return self._context(header, batches), _Layout(len(batches), 0, legacy)
        batches = [Batch(**fields) for fields in header.pop("inline")]
        listed, used = header.pop("slots"), header.pop("slots_used")
        generation, inline = header["generation"], len(batches)
        next_seq = header["actions_to"] + 1
        slot = 0
        while (stored := self._get(self._table, slot_key(session_id, slot))) is not None:
            fields = orjson.loads(stored)  # written by save() below
            # Past the header's slots only the batch that follows, of its generation: an
            # older one is a batch a summary or the close let go of.
            if fields.pop("generation") != generation:
                break
            if slot >= listed and fields["seq_from"] != next_seq:
                break
            batch = Batch(**fields)
            batches.append(batch)
            next_seq, slot = max(next_seq, batch.seq_to + 1), slot + 1
        header["actions_to"] = next_seq - 1
        return self._context(header, batches), _Layout(inline, max(used, slot))

    @staticmethod
    def _context(header: dict[str, Any], batches: list[Batch]) -> SessionContext:
        """The context of a header written by save() (fields it does not know ignored)."""
        header["batches"] = []
        context = SessionContext.from_json({k: v for k, v in header.items() if k in _FIELDS})
        context.batches = batches  # already decoded
        return context

    def save(self, before: SessionContext, after: SessionContext) -> list[Write]:
        """The writes from ``before`` to ``after``, by the module's three ways, each in
        crash-safe order: new slots, the header that lists them, then deletions."""
        sid, table = after.session_id, self._table
        old = self._layout(before)
        new = _appended(before, after)
        writes: list[Write] = []
        if new is None or old.legacy or after.closed:  # 2. the header alone
            layout = _Layout(len(after.batches), 0 if after.closed else old.used)
            writes.append((table, sid, self._header(after, layout)))
            if after.closed:
                writes += [(table, slot_key(sid, n), None) for n in range(old.used)]
            writes += [(table, batch_key(sid, seq), None) for seq in old.legacy]
        else:
            first = len(before.batches) - old.inline  # the next free slot
            generation = after.generation
            writes += [
                (
                    table,
                    slot_key(sid, first + n),
                    _encode(Slot(b.seq_from, b.seq_to, b.text, generation)),
                )
                for n, b in enumerate(new)
            ]
            used = first + len(new)
            layout = old if used <= old.used else _Layout(old.inline, used)
            if not _follows(before, after, new):  # 3. the new slots, then the header
                writes.append((table, sid, self._header(after, layout)))
        if self._generation == self._app.consumer_generation_id:
            self._remember(after, layout)
        return writes

    def _header(self, context: SessionContext, layout: _Layout) -> bytes:
        values = list(_header_values(context))
        for name, at in zip(_NESTED, _NESTED_AT, strict=True):
            if values[at] is not None:
                values[at] = self._nested_json(context.session_id, name, values[at])
        batches = context.batches
        inline = batches[: layout.inline]
        return _encode(_HeaderRecord(*values, inline, len(batches) - layout.inline, layout.used))

    def erase(self, context: SessionContext) -> list[Write]:
        """Tombstones for every slot the session used, its header: nothing stays."""
        sid, table = context.session_id, self._table
        layout = self._layout(context)
        writes: list[Write] = [(table, slot_key(sid, n), None) for n in range(layout.used)]
        writes += [(table, batch_key(sid, seq), None) for seq in layout.legacy]
        writes.append((table, sid, None))
        self._cache.pop(sid, None)
        self._heads.disarm(sid)
        self._forget_nested(sid)
        if self._generation == self._app.consumer_generation_id:
            # What the table holds once the tombstones are in: a later operation of the
            # session in the same inline batch must not load the erased context
            # (test_context.py: test_an_erased_context_is_not_loaded_before_its_tombstones_are_in).
            self._remember(SessionContext(session_id=sid), _FRESH)
        return writes


# What a header holds that a batch appended after the last one leaves as it was: as a
# tuple, compared field by field, each by identity first (a tuple's ``==``), in C.
_HEADER_KEPT = operator.attrgetter(
    *(name for name in SessionContext.__struct_fields__ if name not in ("batches", "actions_to"))
)


def _appended(before: SessionContext, after: SessionContext) -> list[Batch] | None:
    """The batches ``after`` adds after ``before``'s, or None if it drops any (a summary
    drops a prefix; a new generation replaces them all). Contexts share their batches
    (``SessionContext._copy``): a kept first batch is the same object."""
    old, now = before.batches, after.batches
    if after.generation != before.generation or len(now) < len(old):
        return None
    if old and now[0] is not old[0]:
        return None
    return now[len(old) :]


def _follows(before: SessionContext, after: SessionContext, new: list[Batch]) -> bool:
    """Whether ``after`` is ``before`` and one batch right after its last action: then the
    stored header stays as it is, and loading finds the batch by walking on from it. A
    session's first batch writes the header (the pull view answers 404 without one)."""
    if len(new) != 1 or not before.actions_to:
        return False
    if new[0].seq_from != before.actions_to + 1:
        return False  # a gap (an operation dead-lettered): the walk would stop at it
    return _HEADER_KEPT(before) == _HEADER_KEPT(after)
