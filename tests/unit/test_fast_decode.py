"""schemas.fast: our own messages decoded with msgspec give the models pydantic gives."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ActionsPayload, ActionsWritten, InvalidMessage, context_message_adapter
from schemas.fast import (
    SummaryStruct,
    WrittenHeader,
    decode_context_message,
    decode_payload,
    encode_payload,
    header_model,
    payload_of,
    payload_struct,
)
from scripts.bench.sink import operations
from scripts.bench.workload import workload

WRITTEN = {
    "op": "actions_written",
    "session_id": "s",
    "seq_from": 1,
    "seq_to": 2,
    "text": "t",
    "payload": {"session_id": "s", "actions": [{"title": "a"}, {"title": "b"}]},
    "emitted_at": 1.0,
}
SUMMARY = {
    "op": "summary_ready",
    "session_id": "s",
    "seq_from": 1,
    "seq_to": 2,
    "summary": "sum",
    "window_from": 1,
    "emitted_at": 1.0,
}

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
    return encode_payload(payload_struct(payload))  # how the accumulator stores a batch


@settings(max_examples=300, deadline=None)
@given(payloads)
def test_a_stored_batch_decodes_to_the_model_pydantic_validated(data: dict) -> None:
    validated = ActionsPayload.model_validate(data)
    body = _stored(validated)
    fast = payload_of(decode_payload(body))
    assert fast == validated
    assert fast.model_dump() == validated.model_dump()
    assert fast.to_text() == validated.to_text()
    assert [type(a) for a in fast.actions] == [type(a) for a in validated.actions]
    # The same document as pydantic's JSON of the batch, with the same types (repr: 1 is
    # not 1.0); msgspec writes 1e16 where pydantic writes 1e+16.
    assert repr(orjson.loads(body)) == repr(orjson.loads(validated.model_dump_json()))


def test_the_benchmark_workload_round_trips() -> None:
    for raw in workload(500, 50, 3, min_batch=1, max_batch=3):
        validated = ActionsPayload.model_validate(raw)
        assert payload_of(decode_payload(_stored(validated))) == validated


# The context topic's operations (schemas.fast.decode_context_message): what the sink reads.


def _validated(raw: bytes) -> object:
    return context_message_adapter.validate_python(orjson.loads(raw))


def _unread(raw: bytes) -> object:
    """What a sink that does not read the payload must take: pydantic's validation of the
    operation with any JSON value as its payload (it is neither parsed nor checked)."""
    data = orjson.loads(raw)
    if isinstance(data, dict) and data.get("op") == "actions_written" and "payload" in data:
        data["payload"] = {"session_id": "s"}  # a valid one, for the oracle only
    return _validated(orjson.dumps(data))


def _same(raw: bytes) -> None:
    """The fast decode gives pydantic's model, or refuses what pydantic refuses; without
    the payload (a sink that does not read it), the same of the operation whatever its
    payload holds, the payload left None."""
    try:
        expected = _validated(raw)
    except ValueError:
        with pytest.raises(InvalidMessage, match="invalid context operation"):
            decode_context_message(raw)
    else:
        fast = decode_context_message(raw)
        assert type(fast) is type(expected)
        assert fast == expected
        assert fast.model_dump() == expected.model_dump()
    try:
        unread = _unread(raw)
    except ValueError:
        for header in (False, True):
            with pytest.raises(InvalidMessage, match="invalid context operation"):
                decode_context_message(raw, payload=False, header=header)
        return
    header = decode_context_message(raw, payload=False)
    assert type(header) is type(unread)
    if isinstance(header, ActionsWritten):
        assert isinstance(unread, ActionsWritten) and header.payload is None
        assert header.model_copy(update={"payload": unread.payload}) == unread
    else:
        assert header == unread
    # A sink that delivers nothing: the same operation, as the Struct msgspec decoded (an
    # actions_written's header, a summary whole), each field read as the model's.
    struct = decode_context_message(raw, payload=False, header=True)
    if isinstance(struct, (WrittenHeader, SummaryStruct)):
        assert header_model(struct) == header
        assert header_model(struct).model_dump() == header.model_dump()
        assert struct.op == header.op
        for name in struct.__struct_fields__:
            if name not in ("usage", "payload"):  # checked, not read: a sink reads neither
                assert getattr(struct, name) == getattr(header, name), name
    else:
        assert struct == header


def test_the_pipelines_operations_decode_to_the_models_pydantic_validated() -> None:
    records, written, summaries = operations(workload(3000, 60, 5, min_batch=1, max_batch=3), 4)
    assert written and summaries  # both kinds, the summaries with their ledgers
    for _, raw in records:
        _same(raw)


def test_a_sink_that_does_not_read_the_payload_gets_the_newest_actions_time() -> None:
    """The event age at a sink needs the newest action's time: the header carries it, so
    a sink that leaves the payload unbuilt still measures it (sinks/runner/stage.py)."""
    payloads = workload(500, 20, 9, min_batch=1, max_batch=3)
    for n, payload in enumerate(payloads):
        for i, action in enumerate(payload["actions"]):
            action["timestamp_end"] = 1.7e9 + n - i  # the first the newest: the max is read
    records, written, _ = operations(payloads, 4)
    headers = [decode_context_message(raw, payload=False) for _, raw in records]
    writes = [op for op in headers if isinstance(op, ActionsWritten)]
    assert len(writes) == written
    for header, (_, raw) in zip(headers, records, strict=True):
        if isinstance(header, ActionsWritten):
            full = decode_context_message(raw)
            assert isinstance(full, ActionsWritten) and header.payload is None
            assert header.acted_at == max(a.timestamp_end for a in full.payload.actions) > 0


seq = st.integers(-2, 6)
written_ops = st.fixed_dictionaries(
    {
        "op": st.just("actions_written"),
        "session_id": text,
        "seq_from": seq,
        "seq_to": seq,
        "text": text,
        "payload": payloads
        | st.fixed_dictionaries({"session_id": st.sampled_from(["", "a\x1fb"])}),
        "emitted_at": st.floats(allow_nan=False, allow_infinity=False),
    },
    optional={
        "generation": seq,
        "product_id": st.none() | text,
        "conversation_id": st.none() | text,
        "ingested_at": st.integers(0, 2**40),
    },
)
entries = st.fixed_dictionaries({"seq": seq, "text": text}, optional={"a_later_field": seq})
summary_ops = st.fixed_dictionaries(
    {
        "op": st.just("summary_ready"),
        "session_id": text,
        "seq_from": seq,
        "seq_to": seq,
        "summary": text,
        "window_from": seq,
        "emitted_at": st.floats(allow_nan=False, allow_infinity=False),
    },
    optional={
        "generation": seq,
        "final": st.booleans(),
        "ledger": st.none()
        | st.fixed_dictionaries(
            {"actions": seq, "pages": st.dictionaries(text, seq, max_size=2)},
            optional={
                "first_step": st.none() | entries,
                "errors": st.lists(entries, max_size=2),
                "first_at": st.floats(allow_nan=False, allow_infinity=False) | seq,
                "a_later_field": text,  # a later version's: dropped, as pydantic dropped it
            },
        ),
        "usage": st.none()
        | st.fixed_dictionaries(
            {"model": text, "prompt_tokens": seq, "completion_tokens": seq},
            optional={"cost_usd": st.none() | st.floats(0, 1)},
        ),
        "summarized_in_s": st.none() | st.floats(0, 10),
    },
)
erased_ops = st.fixed_dictionaries(
    {"op": st.just("session_erased"), "session_id": text},
    optional={"reason": text, "requested_at": st.floats(0, 1e10), "emitted_at": st.floats(0, 1)},
)


@settings(max_examples=400, deadline=None)
@given(written_ops | summary_ops | erased_ops)
def test_any_operation_decodes_or_is_refused_as_pydantic_does(data: dict) -> None:
    _same(orjson.dumps(data))


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[1, 2]",
        b'{"op": "nothing_known", "session_id": "s"}',
        b'{"session_id": "s", "seq_from": 1, "seq_to": 1}',  # no op
        orjson.dumps({**WRITTEN, "seq_from": 0}),
        orjson.dumps({**WRITTEN, "seq_from": 3, "seq_to": 2}),
        orjson.dumps({**WRITTEN, "generation": -1}),
        orjson.dumps({**WRITTEN, "payload": {"session_id": ""}}),
        orjson.dumps({**WRITTEN, "payload": {"session_id": "a\x1fb"}}),
        orjson.dumps({**WRITTEN, "payload": {"session_id": "s", "actions": [{"index": "x"}]}}),
        orjson.dumps({k: v for k, v in WRITTEN.items() if k != "emitted_at"}),
        orjson.dumps({**SUMMARY, "ledger": {"actions": "many"}}),
        orjson.dumps({**SUMMARY, "usage": {"model": "m"}}),
        b'{"op": "session_erased", "session_id": "s"}',  # no emitted_at
    ],
)
def test_an_operation_that_is_not_valid_is_refused_with_a_reason(raw: bytes) -> None:
    with pytest.raises(ValueError):
        _validated(raw)
    with pytest.raises(InvalidMessage, match="invalid context operation") as refused:
        decode_context_message(raw)
    assert "\n" not in refused.value.reason  # one line: it goes to the dead letter and the log


@pytest.mark.parametrize(
    "summary",
    [{"usage": {"model": "m"}}, {"usage": [1]}, {"ledger": {"actions": "many"}}, {"seq_to": 0}],
)
def test_a_summary_not_valid_is_refused_at_a_sink_that_delivers_nothing(summary: dict) -> None:
    """Its Struct is given only where pydantic takes the model (its usage checked too)."""
    with pytest.raises(InvalidMessage, match="invalid context operation"):
        decode_context_message(orjson.dumps({**SUMMARY, **summary}), payload=False, header=True)


@pytest.mark.parametrize(
    "unread",
    [{"session_id": ""}, {"session_id": "s", "actions": [{"index": "x"}]}, [1, 2], None, "x"],
)
def test_a_sink_that_does_not_read_the_payload_neither_parses_nor_checks_it(unread: object) -> None:
    """It reads the header and the text, checked as strictly as ever; the payload is
    skipped whatever it holds (a third of the decode), where a sink that reads it refuses."""
    raw = orjson.dumps({**WRITTEN, "payload": unread})
    with pytest.raises(InvalidMessage, match="payload"):
        decode_context_message(raw)
    header = decode_context_message(raw, payload=False)
    assert isinstance(header, ActionsWritten) and header.payload is None
    assert (header.session_id, header.seq_to, header.text) == (
        WRITTEN["session_id"], WRITTEN["seq_to"], WRITTEN["text"]
    )  # fmt: skip
    bad_header = orjson.dumps({**WRITTEN, "payload": unread, "seq_from": 0})
    with pytest.raises(InvalidMessage, match="seq_from"):  # the header is still checked
        decode_context_message(bad_header, payload=False)


@pytest.mark.parametrize(
    "changes",
    [
        {"payload": {"session_id": "s", "user_id": "", "email": "", "count": 7}},  # SDK defaults
        {"payload": {"session_id": "s", "actions": [{"title": None, "index": None}]}},
        {"emitted_at": 3},
        {"unknown_field": [1, 2]},
    ],
)
def test_an_operation_pydantic_takes_with_its_defaults_decodes_the_same(changes: dict) -> None:
    _validated(orjson.dumps({**WRITTEN, **changes}))  # pydantic takes it
    _same(orjson.dumps({**WRITTEN, **changes}))


def test_the_sinks_reason_for_a_refused_operation_is_one_line() -> None:
    """What a sink dead-letters and logs (``decode_operation``): pydantic's multi-line
    error with its URL before, one line naming the field now."""
    from sinks.runner.messages import decode_operation

    with pytest.raises(InvalidMessage) as refused:
        decode_operation(orjson.dumps({**WRITTEN, "seq_from": 0}))
    assert refused.value.reason == (
        "invalid context operation: actions_written.seq_from: "
        "Input should be greater than or equal to 1"
    )
