"""The compiled transition (agents/accumulate/compiled.py) writes, byte for byte, what the
Python transition writes: the session entry, the operation, the stored batch and the
summarize request, or it declines and the Python transition does it (as the stage does)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.accumulate.batches import oversized
from agents.accumulate.compiled import apply_compiled, compiled_for
from agents.accumulate.state import (
    Emission,
    Limits,
    MemoryBatchStore,
    SessionState,
    already_applied,
    apply_payload,
)
from schemas import InvalidMessage
from schemas.fast import decode_payload
from scripts.bench.workload import workload
from tests.unit.test_fast_exact import ACTION_KINDS, _mostly, anything, dumps, payloads

# Small, so that the generated steps chunk and summarise early; the service's below.
LIMITS = Limits(threshold=4, max_actions_per_batch=3, max_pending_bytes=1500)
SERVICE = Limits(threshold=10, max_actions_per_batch=50, max_pending_bytes=512 * 1024)
# Built by scripts/bootstrap.sh wherever cargo is; without it the Python path runs alone.
CARGO = shutil.which("cargo") or Path.home().joinpath(".cargo/bin/cargo").exists()
pytestmark = pytest.mark.skipif(
    not compiled_for(LIMITS) and not CARGO, reason="no Rust toolchain: the Python path alone"
)

Step = tuple[bytes | None, list[Emission]] | str
Input = tuple[bytes, int, float, float | None]  # a payload, its offset, now, its timestamp


def python_step(step: Input, entry: bytes | None, store: Any, limits: Limits = LIMITS) -> Step:
    """The stage's Python path: decode, skip a replay, apply, encode the entry."""
    raw, offset, now, ingested = step
    try:
        payload = decode_payload(raw)
    except InvalidMessage:
        return "refused"
    state = SessionState.from_bytes(entry) if entry is not None else None
    if already_applied(state, offset):
        return None, []
    state, out = apply_payload(
        state, payload, offset, limits, now, store=store, ingested_at=ingested
    )
    return state.to_bytes(), out


def compiled_step(
    step: Input, entry: bytes | None, store: Any, limits: Limits = LIMITS
) -> tuple[Step, bool]:
    """The stage's compiled path, and whether it was taken (else the Python path's)."""
    assert compiled_for(limits), "agent_context_native is not built: scripts/bootstrap.sh"
    raw, offset, now, ingested = step
    looked_up: list[str] = []

    def lookup(session_id: str) -> bytes | None:
        looked_up.append(session_id)
        return entry

    done = apply_compiled(raw, lookup, offset, limits, now, store, ingested)
    if done is None:
        return python_step(step, entry, store, limits), False
    assert looked_up == [done.session_id]
    return (done.entry, done.out), True


def _as_list(step: Step) -> Any:
    return step if isinstance(step, str) else (step[0], [(e.topic, e.value) for e in step[1]])


def same_steps(steps: list[Input], limits: Limits = LIMITS) -> int:
    """Both paths over the same steps, each session's entry carried on: equal at every
    step. Returns how many steps the compiled path took."""
    stores = MemoryBatchStore(), MemoryBatchStore()
    entries: dict[str, bytes] = {}
    taken = 0
    for step in steps:
        try:
            sid = decode_payload(step[0]).session_id
        except InvalidMessage:
            sid = ""
        entry = entries.get(sid)
        expected = python_step(step, entry, stores[0], limits)
        found, compiled = compiled_step(step, entry, stores[1], limits)
        taken += compiled
        assert _as_list(found) == _as_list(expected), step
        assert stores[1].batches == stores[0].batches
        if not isinstance(expected, str) and expected[0] is not None:
            entries[sid] = expected[0]
    return taken


# time.time() and a record's timestamp: floats
times = _mostly(st.floats(1e9, 2e9), st.floats(allow_nan=False, allow_infinity=False))
session_payloads = st.builds(
    lambda data, sid: {**data, "session_id": sid} if isinstance(data, dict) else data,
    _mostly(payloads, anything),
    _mostly(st.just("s1"), st.text(max_size=4)),
)
# Well-typed payloads of one or two sessions, which the compiled path mostly takes: its
# state (sequence numbers, conversation id, product id, slots) carried from step to step.
words = st.sampled_from(["", "a", 'Clicked "Save"', "caf\u00e9", "x" * 40])
plain_actions = st.fixed_dictionaries(
    {"type": words, "description": words},
    optional={"title": words, "canonical_url": words, "index": st.integers(0, 9),
              "timestamp_end": st.floats(1e9, 2e9), "conversation_id": st.none() | words},
)  # fmt: skip
plain_payloads = st.fixed_dictionaries(
    {"session_id": st.sampled_from(["s1", "s2"]), "actions": st.lists(plain_actions, max_size=4)},
    optional={"product_id": words, "conversation_id": st.none() | words, "user_id": words},
)
steps = st.lists(
    st.tuples(
        (session_payloads | plain_payloads).map(dumps),
        st.integers(-1, 3),
        times,
        st.none() | st.just(0.0) | times,
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=600, deadline=None)
@given(steps)
def test_the_compiled_transition_writes_what_the_python_one_writes(
    generated: list[Input],
) -> None:
    offset, absolute = 10, []
    for raw, delta, now, ingested in generated:  # offsets mostly rising, some replayed
        offset += delta
        absolute.append((raw, offset, now, ingested))
    same_steps(absolute)


def test_a_payloads_conversation_and_product_are_kept_for_the_next() -> None:
    """A conversation id or product id a payload brings is the session's until another
    comes; payloads without them keep it (the operation carries the session's)."""
    bare = {"session_id": "s", "actions": [_action()]}
    steps: list[Input] = []
    for offset, extra in enumerate(
        [{}, {"conversation_id": "c1", "product_id": "p1"}, {}, {"conversation_id": ""}, {}]
    ):
        steps.append((orjson.dumps({**bare, **extra}), offset, 1764856000.0 + offset, None))
    assert same_steps(steps) == len(steps)


def _action(**fields: Any) -> dict[str, Any]:
    return {"title": "t", "type": "click", "description": "d", "canonical_url": "/u", **fields}


@pytest.mark.parametrize(
    "actions",
    [
        [_action(description='say "hi" \\ back')],
        [_action(description="caf\u00e9 \u2014 \u65e5\u672c")],  # printable beyond ASCII
        [_action(description="tab\there")],  # not printable: escaped by the Python path
        [_action(description="\u2028")],
        [_action(title="line\nbreak", raw_url="\x7f")],
        [_action(timestamp_end=1e16), _action(timestamp_start=1e-5)],
        [_action(timestamp_end=-0.0)],
        [_action(timestamp_end=1764856000.123456, index=-(2**63))],
        [_action(conversation_id="", user_id="")],
        [_action()] * 4,  # past max_actions_per_batch: chunked by the Python path
        [_action(description="x" * 600)] * 3,  # past max_pending_bytes with the next
    ],
)
def test_edge_actions_take_the_path_that_writes_them_alike(actions: list[Any]) -> None:
    raw = orjson.dumps({"session_id": "s", "product_id": "p", "actions": actions})
    same_steps([(raw, 10, 1764856000.5, 1764856000.25), (raw, 11, 1764856001.0, None)])


@pytest.mark.parametrize(
    "entry",
    [
        # A debounced payload, a field of an older version, a float written as an int.
        {"debounce": [{"session_id": "s"}], "debounce_first": 1.5, "debounce_last": 1.5},
        {"ledger": None},
        {"debounce_first": 5, "last_seen": 7},
    ],
)
def test_unusual_entries_are_kept_as_the_python_path_keeps_them(entry: dict[str, Any]) -> None:
    state = SessionState(generation=3, product_id="p", last_offset=4)
    raw = orjson.dumps({**orjson.loads(state.to_bytes()), **entry})
    payload = orjson.dumps({"session_id": "s", "actions": [_action()]})
    stores = MemoryBatchStore(), MemoryBatchStore()
    step = (payload, 5, 1764856000.5, None)
    expected = python_step(step, raw, stores[0])
    found, _ = compiled_step(step, raw, stores[1])
    assert _as_list(found) == _as_list(expected)


def test_the_workload_takes_the_compiled_path() -> None:
    """The bench's payloads (and a real app's, with ids) are the case it covers: a run of
    them takes the compiled path for every payload, the requests included."""
    for ids in (False, True):
        by_session: dict[str, list[Input]] = {}
        for offset, data in enumerate(workload(3000, 40, 1, min_batch=1, max_batch=3, ids=ids)):
            now = 1764856000.0 + offset / 7
            by_session.setdefault(data["session_id"], []).append(
                (orjson.dumps(data), offset, now, now - 0.25)
            )
        for session_steps in by_session.values():
            assert same_steps(session_steps, SERVICE) == len(session_steps)


def test_action_kinds_are_the_models() -> None:
    """The strategies above generate every field the compiled path parses."""
    assert set(ACTION_KINDS) == {
        "title", "description", "canonical_url", "index", "type", "timestamp_start",
        "timestamp_end", "raw_url", "session_id", "user_id", "email", "conversation_id",
    }  # fmt: skip


@pytest.mark.parametrize("event", ["erase", "actions"])
def test_an_erase_request_is_declined_for_the_stage(event: str) -> None:
    """The stage looks for an erasure request only in what the compiled path declines
    (``Accumulator.transition``): one the payload reader takes (no unknown key) must be
    declined, or the session would be updated instead of forgotten."""
    raw = orjson.dumps({"type": event, "session_id": "s1"})
    done = apply_compiled(raw, lambda sid: None, 0, SERVICE, 1.0, MemoryBatchStore(), None)
    assert (done is None) == (event == "erase")


@pytest.mark.parametrize("chars", [100, 450_000, 520_000, 900_000])
def test_a_payload_over_the_message_limit_is_declined_for_the_size_guard(chars: int) -> None:
    """The stage checks the sizes only of what the Python path applied (``oversized``):
    the compiled path declines, staging nothing, exactly what the guard would refuse."""
    raw = orjson.dumps({"session_id": "s1", "actions": [{"type": "x", "description": "y" * chars}]})
    compiled_store, python_store = MemoryBatchStore(), MemoryBatchStore()
    done = apply_compiled(raw, lambda sid: None, 0, SERVICE, 1.0, compiled_store, None)
    expected = python_step((raw, 0, 1.0, None), None, python_store, SERVICE)
    assert not isinstance(expected, str) and expected[0] is not None
    refused = oversized(expected[0], expected[1])
    assert (done is None) == (refused is not None), refused
    assert compiled_store.batches == ({} if done is None else python_store.batches)
