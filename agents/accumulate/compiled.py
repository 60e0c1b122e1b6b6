"""The transition compiled (``native/``: the ``agent_context_native`` extension), where built.

:func:`apply_compiled` is :func:`~agents.accumulate.state.apply_payload` from a payload's
bytes and the session entry's bytes to the new entry and what to emit, without a Python
object per action: the same bytes as the Python transition writes (tests/unit/
test_compiled.py compares them on generated payloads and entries). It covers the common
case (one batch, no PII filter, no debounce); for anything else, or input it is not
sure to write alike, it declines (None) and the caller takes the Python path. Without
the extension (not built, or ``AC_COMPILED=false``) every payload takes the Python path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from agents.accumulate.state import Emission, Limits, Transition
from streams.native import native as _native  # None: not built, the Python transition does it all
from streams.topics import MESSAGE_MAX_BYTES

__all__ = ["Lookup", "apply_compiled", "compiled_for", "run_transitions"]

Lookup = Callable[[str], bytes | None]  # a key's value in the table, None for none


class SlotDicts(Protocol):
    """The dicts of a ``BatchStore`` that the compiled transition reads and fills itself,
    by ``batch_key``: no Python call per batch (``TableBatches``, ``MemoryBatchStore``)."""

    staged: dict[str, bytes | None]  # this change's batches (None: deleted by it)
    written: dict[str, bytes | None]  # what the table holds, where known (None: deleted)


def compiled_for(limits: Limits, *, enabled: bool = True) -> bool:
    """Whether the compiled transition is built, ``enabled`` (``AC_COMPILED``), and can
    take these limits' payloads."""
    return enabled and _native is not None and limits.pii is None and limits.debounce_ms <= 0


def apply_compiled(
    raw: bytes,
    lookup: Lookup,
    offset: int,
    limits: Limits,
    now: float,
    store: SlotDicts,
    ingested_at: float | None,
) -> Transition | None:
    """``apply_payload`` for the payload ``raw`` on its session's entry: ``store.written``'s,
    else ``lookup(session)``'s, as each batch it reads; None when declined: nothing was
    changed, the Python path takes the payload (and refuses one over the message limit)."""
    assert _native is not None  # compiled_for said so
    done = _native.transition(
        raw,
        lookup,
        store.written,
        store.staged,
        offset,
        now,
        ingested_at or 0.0,
        limits.max_actions_per_batch,
        limits.max_pending_bytes,
        limits.threshold,
        MESSAGE_MAX_BYTES,  # past it declined, for the Python path's size guard to refuse
    )
    if done is None:
        return None
    sid, existed, entry, op, request, actions = done
    # The tuples built by tuple.__new__, past NamedTuple's Python __new__: 0.21 against
    # 0.46 µs an Emission, 0.32 against 0.55 a Transition (docs/performance.md, session 40).
    if op is None:
        out = []
    elif request is None:
        out = [_new(Emission, ("context", op))]
    else:
        out = [_new(Emission, ("context", op)), _new(Emission, ("summarize", request))]
    return _new(Transition, (sid, entry, out, existed, actions, None))


def run_transitions(*args: Any) -> tuple[Any, ...]:
    """``native.transition_run``: ``apply_compiled`` for each message in a row, and the
    stage's work on each result, until one it declines; for ``WriteBehind.run_compiled``,
    whose arguments come first, then (messages, start, lookup, written, kept, summarize
    topic, partitions, now, limits)."""
    assert _native is not None  # compiled_for said so
    *head, limits = args
    return _native.transition_run(  # type: ignore[no-any-return]
        *head,
        limits.max_actions_per_batch,
        limits.max_pending_bytes,
        limits.threshold,
        MESSAGE_MAX_BYTES,
    )


_new = tuple.__new__
