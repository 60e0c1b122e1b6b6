"""The session ledger: exact counts from every action, bounded, counted at the summarize
stage from the batches of each request (``count_facts``) and carried by every summary."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import msgspec
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.accumulate.state import Emission, Limits, MemoryBatchStore, apply_payload, close_idle
from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from agents.summarize.state import SummaryState, count_facts
from schemas import (
    ActionsPayload,
    InvalidMessage,
    SlimAction,
    SummarizeRequest,
    SummaryReady,
    decode,
    encode,
)
from schemas.fast import payload_struct
from schemas.ledger import LedgerLimits, SessionLedger, _search, count_batches, new_ledger


def counted_from_input(payloads: list[ActionsPayload], limits: LedgerLimits) -> dict[str, object]:
    """The facts computed independently of ``count_batches``, straight from the actions."""
    actions = [a for p in payloads for a in p.actions]
    texts = [f"{a.type}: {a.title} {a.description}" for a in actions]
    return {
        "actions": len(actions),
        "batches": sum(1 for p in payloads if p.actions),
        "pages": Counter(a.canonical_url for a in actions),
        "errors_total": sum(1 for t in texts if limits.is_error(t)),
        "key_actions_total": sum(1 for t in texts if limits.is_key(t)),
        "last_key": max((i + 1 for i, t in enumerate(texts) if limits.is_key(t)), default=None),
    }


def facts_after(requests: list[SummarizeRequest], limits: LedgerLimits) -> SessionLedger:
    """The ledger the summarize stage holds after taking ``requests`` in order."""
    state = SummaryState(generation=0)
    for request in requests:
        count_facts(state, request, limits)
    assert state.ledger is not None
    return msgspec.convert(state.ledger, SessionLedger)


def requests_of(emissions: list[Emission]) -> list[SummarizeRequest]:
    return [decode(SummarizeRequest, e.value) for e in emissions if e.topic == "summarize"]


def test_the_ledger_counts_equal_those_computed_from_the_input() -> None:
    limits, facts = Limits(threshold=10, max_actions_per_batch=500), LedgerLimits()
    payloads = [
        ActionsPayload.model_validate(p)
        for p in interleaved_payloads(plan_sessions(30, mean_length=80, seed=5), seed=5)
    ]
    by_session: dict[str, list[ActionsPayload]] = {}
    for p in payloads:
        by_session.setdefault(p.session_id, []).append(p)
    for sid, batches in by_session.items():
        store, state, emitted = MemoryBatchStore(), None, []
        for offset, p in enumerate(batches):
            state, out = apply_payload(
                state, payload_struct(p), offset, limits, now=1000.0 + offset, store=store
            )
            emitted += out
        assert state is not None
        emitted += close_idle(state, sid, limits, 9999.0, store)
        ledger = facts_after(requests_of(emitted), facts)
        want = counted_from_input(batches, facts)
        assert ledger.actions == want["actions"] == state.next_seq - 1, sid
        assert ledger.batches == want["batches"], sid
        assert Counter(ledger.pages) == want["pages"], sid  # 8 pages: under the cap, exact
        assert ledger.errors_total == want["errors_total"], sid
        assert ledger.key_actions_total == want["key_actions_total"], sid
        if want["last_key"] is not None:
            assert ledger.key_actions[-1].seq == want["last_key"], sid
        assert ledger.first_step is not None and ledger.first_step.seq == 1
        assert ledger.last_step is not None and ledger.last_step.seq == ledger.actions
        first = batches[0].actions[0]
        assert ledger.first_at == first.timestamp_start


def test_the_ledger_stays_bounded_and_its_page_counts_add_up() -> None:
    limits = LedgerLimits(top_pages=5, key_actions=3, errors=2)
    ledger = new_ledger()
    sizes = []
    for batch in range(1000):  # 10,000 actions over 200 distinct pages
        actions = ActionsPayload.model_validate(
            {
                "session_id": "s",
                "actions": [
                    {
                        "type": "error" if i % 7 == 0 else "click",
                        "description": f"Clicked button {'x' * 300} {batch}",
                        "canonical_url": f"/page/{(batch * 10 + i) % 200}",
                    }
                    for i in range(10)
                ],
            }
        ).actions
        count_batches(ledger, [(actions, 1.0)], batch * 10 + 1, limits)
        sizes.append(len(orjson.dumps(ledger)))
    parsed = msgspec.convert(ledger, SessionLedger)
    assert parsed.actions == 10_000 and len(parsed.pages) == 5
    assert sum(parsed.pages.values()) + parsed.other_page_actions == 10_000
    assert len(parsed.errors) == 2 and len(parsed.key_actions) == 3
    assert parsed.key_actions_total == 10_000 and parsed.errors_total == 1_000 * 2
    assert max(sizes) < 2_000 and max(sizes[100:]) - min(sizes[100:]) < 50, "O(1) bytes"


def test_a_close_always_sends_a_final_and_the_facts_stay_whole() -> None:
    limits = Limits(threshold=5, max_actions_per_batch=500)
    store = MemoryBatchStore()
    payload = ActionsPayload.model_validate(
        {"session_id": "s", "actions": [{"type": "click", "description": "d"}] * 5}
    )
    state, out = apply_payload(None, payload_struct(payload), 0, limits, now=1.0, store=store)
    (request,) = requests_of(out)
    assert request.ledger is None  # counted by the summarize stage, not sent
    # Idle right after that summary: nothing pending, and still a final request, empty.
    (final,) = requests_of(close_idle(state, "s", limits, 9.0, store))
    assert final.final and final.closes_only and (final.seq_from, final.seq_to) == (6, 5)
    assert facts_after([request, final], LedgerLimits()).actions == 5


def test_facts_sent_by_an_older_accumulator_are_taken_as_they_are() -> None:
    """A request written before session 21 carries the facts so far (its own batches
    included): counting its batches again would count them twice."""
    older = SessionLedger(actions=12, batches=3, key_actions_total=2)
    request = SummarizeRequest(
        session_id="s",
        seq_from=11,
        seq_to=12,
        batches=[ActionsPayload(session_id="s", actions=[SlimAction(title="t")] * 2)],
        created_at=1.0,
        ledger=older,
    )
    assert facts_after([request], LedgerLimits()) == older
    state = SummaryState(generation=0)
    count_facts(state, request, None)  # AC_LEDGER=false: no facts at all
    assert state.ledger is None


def test_a_message_model_carries_the_ledger_in_its_json_form() -> None:
    """The message models embed the Struct: its JSON form in, the same JSON out, a JSON
    schema, and a one-line reason naming the wrong field (InvalidMessage, a dead letter)."""
    facts = {
        **new_ledger(),
        "actions": 3,
        "first_at": 1.5,
        "pages": {"/x": 3},
        "errors": [{"seq": 2, "text": "error: failed"}],
        "errors_total": 1,
        "last_step": {"seq": 3, "text": "click: Save"},
    }
    summary = {
        "op": "summary_ready",
        "session_id": "s",
        "seq_from": 1,
        "seq_to": 3,
        "window_from": 1,
        "summary": "sum",
        "emitted_at": 1.0,
    }
    op = decode(SummaryReady, orjson.dumps({**summary, "ledger": facts}))
    assert op.ledger == msgspec.convert(facts, SessionLedger)
    assert op.model_dump(mode="json")["ledger"] == op.model_dump()["ledger"] == facts
    assert decode(SummaryReady, encode(op)) == op
    assert "ledger" in SummaryReady.model_json_schema()["properties"]
    wrong = {**facts, "errors": [{"seq": "two", "text": "t"}]}
    with pytest.raises(InvalidMessage) as refused:
        decode(SummaryReady, orjson.dumps({**summary, "ledger": wrong}))
    assert refused.value.reason == (
        "invalid SummaryReady: ledger: errors[0].seq: Expected `int`, got `str`"
    )


def test_the_ledger_renders_compactly_in_good_english() -> None:
    ledger = new_ledger()
    action = ActionsPayload.model_validate(
        {
            "session_id": "s",
            "actions": [
                {
                    "type": "error",
                    "description": "Saw error 'OAuth failed'",
                    "canonical_url": "/integrations",
                    "timestamp_start": 1_700_000_000.0,
                    "timestamp_end": 1_700_000_090.0,
                }
            ],
        }
    ).actions
    count_batches(ledger, [(action, 0.0)], 1, LedgerLimits())
    assert msgspec.convert(ledger, SessionLedger).render() == (
        "Session facts (counted from every action, not written by the model):\n"
        "- 1 action in 1 batch, 2023-11-14 22:13:20 to 22:14:50 UTC (1m30s)\n"
        "- Pages (actions): /integrations (1)\n"
        "- Errors (1): [1] error: Saw error 'OAuth failed'\n"
        "- Key actions (1): [1] error: Saw error 'OAuth failed'\n"
        "- First step: [1] error: Saw error 'OAuth failed'\n"
        "- Last step: [1] error: Saw error 'OAuth failed'"
    )


def test_remembered_kinds_are_the_searches_answers_past_the_bound() -> None:
    limits = LedgerLimits()
    texts = [f"click: Button {i} error" if i % 3 else f"submit: form {i}" for i in range(5000)]
    for text in texts + texts[:10]:  # past KINDS_REMEMBERED: forgotten, then found again
        assert limits.kinds(text) == (limits.is_error(text), limits.is_key(text))


# The default patterns' words with their suffixes, and the variants (?i) matches that
# str.lower() does not fold (ſ for s, K for k, ı and İ for i): text holding them is not ASCII.
_KIND_WORDS = [
    *("submit", "form_submit", "submitted", "error", "button", "failed", "upgrade"),
    *("purchase", "checkout", "cancel", "cancelled", "delete", "deleted", "export"),
    *("invite", "invited", "connect", "exception", "ſubmit", "chec\u212aout", "faıled", "İnvite"),
]


@st.composite
def kind_texts(draw: st.DrawFn) -> str:
    """Lines of the words around word boundaries and inside longer words, in any case."""
    piece = st.one_of(
        st.sampled_from(_KIND_WORDS).flatmap(
            lambda w: st.sampled_from([w, w.upper(), w.title(), w.swapcase(), w[:-1], w + "s"])
        ),
        st.text(alphabet="ab _:-.'\"1é", max_size=4),
    )
    return "".join(draw(st.lists(piece, max_size=8)))


@settings(max_examples=600, deadline=None)
@given(kind_texts())
def test_the_default_patterns_gates_are_exact(text: str) -> None:
    limits = LedgerLimits()
    assert limits.kinds(text) == (limits.is_error(text), limits.is_key(text))


def test_the_gate_skips_the_search_only_where_no_match_can_be() -> None:
    class Unsearchable:
        def search(self, text: str) -> None:
            raise AssertionError(f"searched {text!r}")

    words = ("error", "failed")
    assert _search(Unsearchable(), words, "click: Saved", "click: saved") is False  # type: ignore[arg-type]
    assert _search(re.compile("(?i)failed"), words, "FAILED x", "failed x") is True
    assert _search(re.compile("(?i)failed"), words, "faıled", None) is True  # not ASCII: searched
    custom = LedgerLimits(key_pattern=r"(?i)\bsaved\b")  # a user's pattern: no gate
    assert custom.kinds("click: Saved") == (False, True)


def _push(entries: list[dict[str, Any]], entry: dict[str, Any], keep: int) -> None:
    entries.append(entry)
    if len(entries) > keep:
        del entries[: len(entries) - keep]


def _per_action(
    ledger: dict[str, Any], actions: list[Any], seq_from: int, limits: Any, now: float
) -> None:
    """The oracle: 873a9aa's ledger update, every total and bound applied per action."""
    from schemas.ledger import _entry, _page

    if not actions:
        return
    ledger["batches"] += 1
    pages = ledger["pages"]
    for offset, action in enumerate(actions):
        seq = seq_from + offset
        ledger["actions"] += 1
        started = action.timestamp_start or action.timestamp_end or now
        ended = action.timestamp_end or action.timestamp_start or now
        if not ledger["first_at"]:
            ledger["first_at"] = started
        ledger["last_at"] = max(ledger["last_at"], ended)
        page = _page(action.canonical_url or action.raw_url)
        if page in pages:
            pages[page] += 1
        else:
            if len(pages) >= limits.top_pages:
                least = min(pages, key=pages.__getitem__)
                ledger["other_page_actions"] += pages.pop(least)
            pages[page] = 1
        if ledger["first_step"] is None:
            ledger["first_step"] = _entry(seq, action)
        is_error, is_key = limits.kinds(f"{action.type}: {action.title} {action.description}")
        if is_error:
            ledger["errors_total"] += 1
            _push(ledger["errors"], _entry(seq, action), limits.errors)
        if is_key:
            ledger["key_actions_total"] += 1
            _push(ledger["key_actions"], _entry(seq, action), limits.key_actions)
    ledger["last_step"] = _entry(seq_from + len(actions) - 1, actions[-1])


_action = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["click", "error", "submit", ""]),
        "title": st.sampled_from(["", "Save", "Failed"]),
        "timestamp_start": st.sampled_from([0.0, 1.5, 3.0]),
        "timestamp_end": st.sampled_from([0.0, 2.5]),
        "canonical_url": st.sampled_from(["", "/a", "/b", "/c"]),
        "raw_url": st.sampled_from(["", "/r"]),
    }
)


@given(
    batches=st.lists(st.lists(_action, max_size=6), max_size=6),
    bounds=st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 2)),
    now=st.sampled_from([0.0, 9.0]),
)
@settings(max_examples=300, deadline=None)
def test_counting_batch_by_batch_is_the_per_action_ledger(
    batches: list[list[dict[str, Any]]], bounds: tuple[int, int, int], now: float
) -> None:
    top_pages, errors, key_actions = bounds
    limits = LedgerLimits(top_pages=top_pages, errors=errors, key_actions=key_actions)
    fast, oracle, seq = new_ledger(), new_ledger(), 1
    for batch in batches:
        actions = ActionsPayload.model_validate({"session_id": "s", "actions": batch}).actions
        count_batches(fast, [(actions, now)], seq, limits)
        _per_action(oracle, actions, seq, limits, now)
        seq += len(actions)
        assert orjson.dumps(fast) == orjson.dumps(oracle)


@given(
    batches=st.lists(
        st.tuples(st.lists(_action, max_size=6), st.sampled_from([0.0, 4.0, 9.0])), max_size=6
    ),
    bounds=st.tuples(st.integers(1, 3), st.integers(0, 2), st.integers(0, 2)),
)
@settings(max_examples=300, deadline=None)
def test_a_request_counted_in_one_pass_is_the_per_action_ledger(
    batches: list[tuple[list[dict[str, Any]], float]], bounds: tuple[int, int, int]
) -> None:
    """``count_batches`` over a whole request, each batch with its own time for undated
    actions, against the oracle counting action by action, batch by batch."""
    top_pages, errors, key_actions = bounds
    limits = LedgerLimits(top_pages=top_pages, errors=errors, key_actions=key_actions)
    fast, oracle = new_ledger(), new_ledger()
    request = [
        (ActionsPayload.model_validate({"session_id": "s", "actions": b}).actions, now)
        for b, now in batches
    ]
    count_batches(fast, request, 5, limits)
    seq = 5
    for actions, now in request:
        _per_action(oracle, actions, seq, limits, now)
        seq += len(actions)
    assert orjson.dumps(fast) == orjson.dumps(oracle)
