"""schemas.fast: our own messages decoded with msgspec give the models pydantic gives."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ActionsPayload, InvalidMessage
from schemas.fast import decode_payload
from scripts.bench.workload import workload

text = st.text(max_size=30)
actions = st.fixed_dictionaries(
    {},
    optional={
        "title": text,
        "description": text,
        "canonical_url": text,
        "index": st.integers(-(2**31), 2**31),
        "type": text,
        "timestamp_start": st.floats(allow_nan=False, allow_infinity=False),
        "timestamp_end": st.integers(0, 2**40),
        "session_id": st.none() | text,
        "user_id": st.none() | text,
        "email": st.none() | text,
        "conversation_id": st.none() | text,
    },
)
payloads = st.fixed_dictionaries(
    {
        "session_id": st.text(min_size=1, max_size=20).filter(lambda s: "\x1f" not in s),
        "actions": st.lists(actions, max_size=4),
    },
    optional={
        "product_id": text,
        "user_id": st.none() | text,
        "email": st.none() | text,
        "count": st.integers(0, 9),
        "forwarded_at": st.floats(allow_nan=False, allow_infinity=False),
        "conversation_id": st.none() | text,
    },
)


def _stored(payload: ActionsPayload) -> bytes:
    return orjson.dumps(payload.model_dump(mode="json"))  # how the accumulator stores a batch


@settings(max_examples=300, deadline=None)
@given(payloads)
def test_a_stored_batch_decodes_to_the_model_pydantic_validated(data: dict) -> None:
    validated = ActionsPayload.model_validate(data)
    fast = decode_payload(_stored(validated))
    assert fast == validated
    assert fast.model_dump() == validated.model_dump()
    assert fast.to_text() == validated.to_text()
    assert [type(a) for a in fast.actions] == [type(a) for a in validated.actions]
    # The accumulator stores pydantic-core's JSON of a batch (agents.accumulate.state): the
    # same document as model_dump + orjson, with the same types (repr: 1 is not 1.0).
    body = validated.__pydantic_serializer__.to_json(validated)
    assert repr(orjson.loads(body)) == repr(orjson.loads(_stored(validated)))
    assert decode_payload(body) == validated


def test_the_benchmark_workload_round_trips() -> None:
    for raw in workload(500, 50, 3, min_batch=1, max_batch=3):
        validated = ActionsPayload.model_validate(raw)
        assert decode_payload(_stored(validated)) == validated


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"session_id": 5, "actions": []}', "invalid stored batch"),
        (b'{"session_id": "s", "actions": [{"index": "x"}]}', "invalid stored batch"),
    ],
)
def test_a_batch_that_is_not_ours_is_refused_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessage, match=reason):
        decode_payload(raw)
