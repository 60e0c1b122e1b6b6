"""Wire compatibility with autoplay_sdk's models, checked on generated payloads."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
import orjson
import pytest
from autoplay_sdk.core.models import ActionsPayload as SdkPayload
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas import ActionsPayload, InvalidMessage, decode
from schemas.ledger import LedgerLimits, SessionLedger, count_batches, new_ledger
from schemas.text import printable

ACTION_FIELDS = (
    "title",
    "description",
    "canonical_url",
    "index",
    "type",
    "timestamp_start",
    "timestamp_end",
    "raw_url",
    "session_id",
    "user_id",
    "email",
    "conversation_id",
)
PAYLOAD_FIELDS = (
    "product_id",
    "session_id",
    "user_id",
    "email",
    "count",
    "forwarded_at",
    "conversation_id",
)

# The SDK warns on every count mismatch; that noise says nothing here.
logging.getLogger("autoplay_sdk").setLevel(logging.ERROR)

text = st.text(max_size=40)
maybe_text = st.none() | st.just("") | text
number = st.floats(allow_nan=False, allow_infinity=False, width=64) | st.integers(-(10**12), 10**12)


def optional_fields(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """Each field present with a value (null included) or absent."""
    return st.fixed_dictionaries({}, optional=fields)


actions = optional_fields(
    title=st.none() | text,
    description=st.none() | text,
    canonical_url=st.none() | text,
    index=st.none() | st.integers(0, 10**9),
    type=st.none() | text,
    timestamp_start=st.none() | number,
    timestamp_end=st.none() | number,
    raw_url=st.none() | text,
    session_id=maybe_text,
    user_id=maybe_text,
    email=maybe_text,
    conversation_id=maybe_text,
    unknown_key=text,
)


@st.composite
def payloads(draw: st.DrawFn) -> dict[str, Any]:
    body = draw(
        optional_fields(
            type=st.just("actions"),
            product_id=st.none() | text,
            user_id=maybe_text,
            email=maybe_text,
            actions=st.none() | st.lists(actions, max_size=6),
            count=st.none() | st.integers(-5, 50),
            forwarded_at=st.none() | number,
            conversation_id=maybe_text,
        )
    )
    # Any id but one holding U+001F (rejected: test_bad_input_is_rejected_with_a_reason).
    body["session_id"] = draw(
        st.text(st.characters(codec="utf-8", exclude_characters="\x1f"), min_size=1, max_size=30)
    )
    return body


def assert_same(ours: ActionsPayload, sdk: SdkPayload) -> None:
    for name in PAYLOAD_FIELDS:
        assert getattr(ours, name) == getattr(sdk, name), name
    assert len(ours.actions) == len(sdk.actions)
    for mine, theirs in zip(ours.actions, sdk.actions, strict=True):
        for name in ACTION_FIELDS:
            assert getattr(mine, name) == getattr(theirs, name), name


@settings(max_examples=500, deadline=None)
@given(payloads())
def test_parsing_matches_the_sdk(raw: dict[str, Any]) -> None:
    assert_same(ActionsPayload.model_validate(raw), SdkPayload.from_dict(raw))


@settings(max_examples=500, deadline=None)
@given(payloads())
def test_to_text_matches_the_sdk(raw: dict[str, Any]) -> None:
    assert ActionsPayload.model_validate(raw).to_text() == SdkPayload.from_dict(raw).to_text()


@settings(max_examples=500, deadline=None)
@given(st.lists(payloads(), min_size=1, max_size=4))
def test_merge_matches_the_sdk(raws: list[dict[str, Any]]) -> None:
    ours = ActionsPayload.merge([ActionsPayload.model_validate(r) for r in raws])
    sdk = SdkPayload.merge([SdkPayload.from_dict(r) for r in raws])
    assert_same(ours, sdk)
    assert ours.to_text() == sdk.to_text()


def test_merge_of_nothing_is_an_error_like_the_sdk() -> None:
    with pytest.raises(ValueError):
        ActionsPayload.merge([])


def test_json_round_trip_keeps_every_field() -> None:
    raw = {
        "product_id": "p",
        "session_id": "s",
        "user_id": "u",
        "email": "e@x",
        "count": 1,
        "forwarded_at": 2.5,
        "conversation_id": "c",
        "actions": [
            {
                "title": "t",
                "description": "d",
                "canonical_url": "/u",
                "index": 3,
                "type": "click",
                "timestamp_start": 1.0,
                "timestamp_end": 2.0,
                "raw_url": "/u?x",
                "session_id": "s",
                "user_id": "u",
                "email": "e@x",
                "conversation_id": "c",
            }
        ],
    }
    parsed = decode(ActionsPayload, orjson.dumps(raw))
    assert decode(ActionsPayload, orjson.dumps(parsed.model_dump(mode="json"))) == parsed


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"actions": []}', "session_id is missing"),
        (b'{"session_id": "", "actions": []}', "session_id is missing"),
        (b'{"session_id": null}', "session_id is missing"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{not json", "not valid JSON"),
        (b'{"session_id": "s", "actions": [{"index": "third"}]}', "actions.0.index"),
        (b'{"session_id": "s", "actions": [{"title": {"x": 1}}]}', "actions.0.title"),
        (b'{"session_id": "s", "actions": "many"}', "actions"),
        (b'{"session_id": "a\\u001fb", "actions": []}', "must not contain U+001F"),
    ],
)
def test_bad_input_is_rejected_with_a_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(InvalidMessage) as caught:
        decode(ActionsPayload, raw)
    assert reason in caught.value.reason


def test_control_and_bidi_characters_are_escaped_in_what_destinations_get() -> None:
    """The old code passed NUL, BEL, ESC, DEL and U+202E into context text and notes."""
    hostile = "NUL \x00 BEL \x07 ESC \x1b[31m DEL \x7f RLO \u202e LRI \u2066 LS \u2028 end"
    payload = ActionsPayload.model_validate(
        {
            "session_id": "s\u202e1",
            "actions": [{"type": "click", "description": hostile + "\n[99] click: spoofed"}],
        }
    )
    text = payload.numbered_text(1)
    assert text == (
        "Session s\\u202e1 — action 1\n"
        "[1] click: NUL \\x00 BEL \\x07 ESC \\x1b[31m DEL \\x7f RLO \\u202e LRI \\u2066 "
        "LS \\u2028 end\\n[99] click: spoofed — "
    )
    assert printable("tab\tand\nnewline\r") == "tab\tand\nnewline\\x0d"
    assert printable(printable(hostile)) == printable(hostile)  # escaping twice changes nothing
    ledger = new_ledger()
    count_batches(ledger, [(payload.actions, 0.0)], 1, LedgerLimits())
    rendered = msgspec.convert(ledger, SessionLedger).render()
    assert all(ch in "\n" or ch.isprintable() for ch in rendered), rendered


def test_escaping_searches_first_and_escapes_every_character_translate_would() -> None:
    """schemas.text skips ``translate`` when nothing needs escaping; each character it
    escapes, alone or in text, comes out as the full translation table says."""
    from schemas.text import _ONE_LINE, _PRINTABLE, one_line

    for table, escape in ((_PRINTABLE, printable), (_ONE_LINE, one_line)):
        for cp in range(0x3000):
            text = f"a {chr(cp)} — b"
            assert escape(text) == text.translate(table), hex(cp)
    plain = "[1] click: Save — https://app.example.com/projects/:id"
    assert one_line(plain) is plain


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from("ab \n\r\t\x00\x1b\x7f\xa0\xad\u202e\u2028—[]"))))
def test_one_line_each(fields: list[str]) -> None:
    """One search of the joined text gives what escaping every line alone gives, a
    newline inside a line included (that line must not read as two)."""
    from schemas.text import one_line, one_line_each

    lines = [f"[{i}] {field}" for i, field in enumerate(fields)] or [""]
    assert one_line_each(lines) == "\n".join(map(one_line, lines))
    assert one_line_each(lines).count("\n") == len(lines) - 1
