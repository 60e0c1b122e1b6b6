"""schemas.fast's exact paths: an input payload or a summarize request decoded with
msgspec gives exactly pydantic's values (an input's Struct encodes to the JSON of
pydantic's model), or pydantic's refusal (pydantic is the oracle)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from agents.accumulate.state import Limits, MemoryBatchStore, apply_payload, close_idle
from agents.summarize.state import SummaryState, count_facts
from schemas import ActionsPayload, InvalidMessage, SlimAction, SummarizeRequest, decode
from schemas.fast import (
    Action,
    Payload,
    decode_payload,
    decode_request,
    encode_payload,
    payload_model,
    payload_struct,
)
from schemas.ledger import LedgerLimits
from scripts.bench.workload import workload

big_ints = st.sampled_from([2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 2**64 + 1, 10**30])
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | big_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
    | st.sampled_from(["", "\x1f", "s\x1fx", "5", "1.5", "true", "null"])
)
anything = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=6,
)
text = st.text(max_size=12)
ACTION_KINDS: dict[str, Any] = {
    "title": text,
    "description": text,
    "canonical_url": text,
    "index": st.integers(-(2**40), 2**40),
    "type": text,
    "timestamp_start": st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**40),
    "timestamp_end": st.floats(allow_nan=False, allow_infinity=False),
    "raw_url": text,
    "session_id": st.none() | text,
    "user_id": st.none() | text,
    "email": st.none() | text,
    "conversation_id": st.none() | text,
}
PAYLOAD_KINDS: dict[str, Any] = {
    "type": st.just("actions"),
    "product_id": text,
    "user_id": st.none() | text,
    "email": st.none() | st.sampled_from(["", "a@b.c"]),
    "count": st.integers(0, 9),
    "forwarded_at": st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**40),
    "conversation_id": st.none() | text,
}


def _mostly(kind: Any, other: Any) -> Any:
    """``kind`` six times in seven (one_of would weigh the two alike)."""
    return st.integers(0, 6).flatmap(lambda i: other if i == 6 else kind)


def _field(kind: Any) -> Any:
    """Mostly well typed, sometimes anything at all (null, mistyped, nested)."""
    return _mostly(kind, anything)


def _object(kinds: dict[str, Any], extra: bool) -> Any:
    optional = {k: _field(v) for k, v in kinds.items()}
    if extra:
        optional["zz_extra"] = anything
    return st.fixed_dictionaries({}, optional=optional)


actions = _mostly(_object(ACTION_KINDS, extra=False), _object(ACTION_KINDS, extra=True) | anything)
payloads = st.builds(
    lambda base, sid, acts: {**base, **sid, **acts},
    _mostly(_object(PAYLOAD_KINDS, extra=False), _object(PAYLOAD_KINDS, extra=True)),
    _mostly(
        st.fixed_dictionaries({"session_id": _field(st.text(min_size=1, max_size=10))}), st.just({})
    ),
    _mostly(
        st.fixed_dictionaries({"actions": st.lists(actions, max_size=3)}),
        st.just({}) | st.fixed_dictionaries({"actions": anything}),
    ),
)


def dumps(data: Any) -> bytes:
    return json.dumps(data, ensure_ascii=False).encode()  # orjson refuses ints past 64 bits


def outcome(decoder: Any, raw: bytes | None) -> tuple[str, str]:
    """What a decoder gives: its values with their types (repr: 1 is not 1.0), or why not."""
    try:
        found = decoder(raw)
    except InvalidMessage as exc:
        return ("refused", exc.reason)
    values = found.model_dump() if isinstance(found, BaseModel) else msgspec.to_builtins(found)
    return ("accepted", repr(values))


def _pydantic_input(raw: bytes | None) -> ActionsPayload:
    return decode(ActionsPayload, raw)


def same_input(raw: bytes) -> None:
    """decode_payload gives pydantic's values or its refusal, and the JSON it is stored
    as reads as the model's JSON does (the same values and types)."""
    assert outcome(decode_payload, raw) == outcome(_pydantic_input, raw)
    try:
        model = _pydantic_input(raw)
    except InvalidMessage:
        return
    stored = encode_payload(decode_payload(raw))
    assert repr(json.loads(stored)) == repr(json.loads(model.model_dump_json()))


def _pydantic_request(raw: bytes | None) -> SummarizeRequest:
    return decode(SummarizeRequest, raw)


@settings(max_examples=1500, deadline=None)
@given(_mostly(payloads, anything))
def test_an_input_payload_decodes_as_pydantic_decodes_it(data: Any) -> None:
    same_input(dumps(data))


@pytest.mark.parametrize(
    "raw",
    [
        None,
        b"",
        b"[]",
        b'"s"',
        b'{"session_id":"s","x":"\xff"}',  # invalid UTF-8 in a field nobody reads
        b'{"session_id":"s","x":1e400}',
        b'{"session_id":"s","x":' + b"[" * 2000 + b"]" * 2000 + b"}",
        b'{"session_id":"s","forwarded_at":1e400}',
        b'{"session_id":"s","actions":[{"index":18446744073709551617}]}',
        b'{"session_id":"s","actions":[{"index":1e2}]}',
        b'{"session_id":"s","actions":[{"index":"5"}]}',
        b'{"session_id":"s","actions":[{"index":true}]}',
        b'{"session_id":"s","actions":[{"title":null,"index":null}]}',
        b'{"session_id":"s","actions":[{"index":"x"}],"actions":[]}',  # the last one counts
        b'{"session_id":"","session_id":"s"}',
        b'{"session_id":"s","type":5,"count":"x"}',
        b'{"session_id":"s","user_id":"","email":""}',
        b'{"session_id":"a\\u001fb"}',
        b'{"session_id":"\\ud83d\\ude00"}',  # an escaped surrogate pair
        b'{"session_id":"s","product_id":"\\ud800"}',  # a lone one
        b'{"session_id":"s","forwarded_at":-0,"actions":[{"index":-0,"timestamp_end":1E5}]}',
        b'{"session_id":"s","actions":[{"index":1.0}]}',
        b'{"session_id":"s","forwarded_at":18446744073709551617}',
        b'\xef\xbb\xbf{"session_id":"s"}',
        b'{"session_id":"s"} x',
    ],
)
def test_edge_inputs_decode_as_pydantic_decodes_them(raw: bytes | None) -> None:
    if raw is None:
        assert outcome(decode_payload, raw) == outcome(_pydantic_input, raw)
    else:
        same_input(raw)


def test_the_structs_are_the_models() -> None:
    """Action and Payload have the models' fields, in their order, with their defaults:
    what makes a Struct's JSON the model's."""
    for struct, model in ((Action, SlimAction), (Payload, ActionsPayload)):
        fields = msgspec.structs.fields(struct)
        assert [f.name for f in fields] == list(model.model_fields)
        for f in fields:
            field = model.model_fields[f.name]
            assert f.required == field.is_required(), f.name
            if not f.required:
                made = f.default_factory() if f.default is msgspec.NODEFAULT else f.default
                assert made == field.get_default(call_default_factory=True), f.name
            assert f.type == field.annotation or f.name == "actions"


def test_the_stored_batch_is_the_models_json() -> None:
    """The workload's payloads are stored byte for byte as pydantic writes them."""
    for data in workload(2000, 50, 1, min_batch=1, max_batch=5):
        raw = orjson.dumps(data)
        model = _pydantic_input(raw)
        assert encode_payload(decode_payload(raw)) == model.__pydantic_serializer__.to_json(model)
        assert encode_payload(payload_struct(model)) == model.model_dump_json().encode()


def _requests() -> list[bytes]:
    """Real requests, as the accumulator emits them, and final ones; then each again
    with the facts so far, as a worker before session 21 sent them."""
    store, limits = MemoryBatchStore(), Limits(threshold=10, max_actions_per_batch=3)
    states: dict[str, Any] = {}
    out = []
    for offset, data in enumerate(workload(400, 4, 3, min_batch=1, max_batch=5)):
        payload = payload_struct(ActionsPayload.model_validate(data))
        sid = payload.session_id
        states[sid], emitted = apply_payload(
            states.get(sid), payload, offset, limits, 1.0, store=store
        )
        out.extend(e.value for e in emitted if e.topic == "summarize")
    for sid, state in states.items():
        out.extend(e.value for e in close_idle(state, sid, limits, 2.0, store))
    facts: dict[str, SummaryState] = {}
    with_ledgers = []
    for raw in out:
        request = decode(SummarizeRequest, raw)
        state = facts.setdefault(request.session_id, SummaryState(generation=0))
        count_facts(state, request, LedgerLimits())
        with_ledgers.append(dumps({**orjson.loads(raw), "ledger": state.ledger}))
    return out + with_ledgers


REQUESTS = _requests()


def test_real_requests_decode_to_the_pydantic_models_values() -> None:
    """The summarize stage's Request holds the model's values (its batches as Payloads,
    which convert to the model's batches for user code; its ledger as the model's JSON)."""
    assert len(REQUESTS) > 10
    for raw in REQUESTS:
        fast, validated = decode_request(raw), decode(SummarizeRequest, raw)
        assert outcome(decode_request, raw) == outcome(_pydantic_request, raw)
        assert [payload_model(b) for b in fast.batches] == validated.batches
        assert fast.ledger == (validated.ledger and msgspec.to_builtins(validated.ledger))
    assert sum(decode_request(raw).ledger is not None for raw in REQUESTS) == len(REQUESTS) // 2


def _changed(**changes: Any) -> bytes:
    data = orjson.loads(REQUESTS[0])
    data.update(changes)
    return dumps(data)


def _batch_changed(**changes: Any) -> bytes:
    data = orjson.loads(REQUESTS[0])
    data["batches"][0].update(changes)
    return dumps(data)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (None, "empty message"),
        (b"{not json", "not valid JSON"),
        (_changed(seq_from=0), "seq_from"),
        (_changed(seq_to=0), "seq_to"),
        (_changed(generation=-1), "generation"),
        (_changed(seq_from=5, seq_to=4), "empty range"),
        (_changed(seq_from=5, seq_to=4, final=True), "empty range"),  # a final with batches
        (_changed(seq_from=6, seq_to=4, final=True, batches=[]), "empty range"),
        (_changed(created_at=None), "created_at"),
        (_changed(ledger=[]), "ledger"),
        (_changed(ledger={"pages": {"p": "x"}}), "ledger: pages.*: Expected `int`, got `str`"),
        (_changed(batches=None), "batches"),
        (_batch_changed(session_id=""), "session_id is missing"),
        (_batch_changed(session_id="a\x1fb"), r"U\+001F"),
        (_batch_changed(actions=[{"index": "x"}]), "index"),
    ],
)
def test_each_refusal_is_pydantics(raw: bytes | None, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_request(raw)
    assert outcome(decode_request, raw) == outcome(_pydantic_request, raw)


@pytest.mark.parametrize(
    "raw",
    [
        _changed(seq_from=5, seq_to=4, final=True, batches=[]),  # a close right after a summary
        _changed(extra_field={"x": 1}),
        _changed(ledger=None),
        _changed(generation=2**64 + 1),
        _batch_changed(user_id="", email=""),
        _batch_changed(count=99),
    ],
)
def test_accepted_variants_decode_as_pydantic_decodes_them(raw: bytes) -> None:
    assert outcome(decode_request, raw) == outcome(_pydantic_request, raw)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(orjson.loads(REQUESTS[0]))), anything)
def test_a_request_with_any_field_changed_decodes_as_pydantic_decodes_it(
    name: str, value: Any
) -> None:
    raw = _changed(**{name: value})
    assert outcome(decode_request, raw) == outcome(_pydantic_request, raw)
