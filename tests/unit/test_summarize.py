"""The summarize agent's state: actions of failed requests carried forward, bounded; the
summary operation it writes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agents.pii import PiiFilter
from agents.summarize import CARRY_MAX_BYTES, SummaryState, fold_large_carry
from agents.summarize.state import count_facts, summary_operation
from agents.summarizer import DEFAULT_PROMPT, LLMSummarizer, ResilientLLM, default_format_actions
from agents.summarizer.llm import Completion
from schemas import (
    ActionsPayload,
    InvalidMessage,
    SessionErased,
    SummarizeRequest,
    SummaryReady,
    SummaryUsage,
    encode,
)
from schemas.fast import decode_context_message, decode_request
from schemas.ledger import LedgerLimits, SessionLedger
from streams.settings import Settings
from streams.topics import MESSAGE_MAX_BYTES


def batch(start: int, n: int, text: str = "did a thing") -> dict[str, Any]:
    return {
        "session_id": "s1",
        "actions": [
            {"description": f"{text} {i}", "type": "click", "canonical_url": f"/page/{i % 3}"}
            for i in range(start, start + n)
        ],
    }


def test_a_small_carry_is_kept_as_it_is() -> None:
    state = SummaryState(generation=1, summary="Earlier.", carry=[batch(0, 10)], carry_from=11)
    assert not fold_large_carry(state, max_chars=1500, total=20)
    assert state.carry == [batch(0, 10)] and state.summary == "Earlier."


def test_a_carry_past_the_budget_is_folded_into_a_bounded_summary() -> None:
    """Hundreds of failed requests (a long LLM outage): the state entry and the next prompt
    would pass the message limit; instead the carry becomes part of the summary, and the
    window of the next emitted summary still starts where the carry did."""
    state = SummaryState(generation=1, summary="The user signed up. " * 100, covered_to=10)
    state.carry_from = 11
    start = 0
    while not fold_large_carry(state, max_chars=1500, total=10 + start):
        state.carry.append(batch(start, 10, "x" * 200))
        start += 10
        assert len(state.to_bytes()) < MESSAGE_MAX_BYTES
    assert state.carry == [] and state.carry_from == 11 and state.pending
    assert state.summary is not None and len(state.summary) <= 1500 + 40
    assert state.summary.startswith("The user signed up.")
    # The offline summary of the carry states the session's count, not the carry's.
    assert f"{10 + start} actions so far" in state.summary
    assert len(state.to_bytes()) < CARRY_MAX_BYTES


def request_of(seq_from: int, n: int, *, final: bool = False) -> SummarizeRequest:
    actions = [
        {
            "title": f"Step {i}",
            "description": "Export failed" if i % 4 == 0 else f"clicked button {i}",
            "type": "error" if i % 4 == 0 else "click",
            "canonical_url": f"/page/{i % 3}",
            "timestamp_start": 1_700_000_000.25 + i,
            "timestamp_end": 1_700_000_000.5 + i,
        }
        for i in range(seq_from, seq_from + n)
    ]
    batch = {"session_id": "s1", "actions": actions, "conversation_id": "conv-7"}
    return SummarizeRequest(
        session_id="s1",
        product_id="p1",
        generation=42,
        seq_from=seq_from,
        seq_to=seq_from + n - 1,
        batches=[ActionsPayload.model_validate(batch)],
        final=final,
        created_at=1_700_000_100.125,
    )


@pytest.mark.parametrize("carry_from", [None, 3])
@pytest.mark.parametrize("ledger", [True, False])
@pytest.mark.parametrize("priced", [True, False])
def test_the_summary_operation_is_the_models_bytes(
    carry_from: int | None, ledger: bool, priced: bool
) -> None:
    """The operation written straight from the state's values (no model built) is the
    JSON ``encode(SummaryReady(...))`` writes, byte for byte, and decodes to that model."""
    state = SummaryState(generation=42, carry_from=carry_from, requested_to=10)
    request = request_of(11, 10, final=carry_from is None)
    count_facts(state, request_of(1, 10), LedgerLimits() if ledger else None)
    count_facts(state, request, LedgerLimits() if ledger else None)
    usage = SummaryUsage(
        model="m", prompt_tokens=120, completion_tokens=30, cost_usd=0.0004 if priced else None
    )
    text = Completion("The user exported twice; it failed.", usage=None)
    raw = summary_operation(
        request, state, text, conversation="conv-7", usage=usage, took_s=0.12345, now=1.7e9
    )
    model = SummaryReady(
        session_id="s1",
        product_id="p1",
        conversation_id="conv-7",
        generation=42,
        seq_from=1,
        seq_to=20,
        window_from=carry_from or 11,
        summary=text,
        final=carry_from is None,
        emitted_at=1.7e9,
        ledger=None if state.ledger is None else msgspec.convert(state.ledger, SessionLedger),
        usage=usage,
        summarized_in_s=0.123,
    )
    assert raw == encode(model)
    assert decode_context_message(raw) == model
    assert (model.ledger is not None) == ledger


async def test_the_stage_requests_batches_give_the_prompt_models_give() -> None:
    """The stage hands the summarizer its request's batches as Structs (no model built):
    the default formatter writes the same prompt from them, and a user's formatter
    (``AC_FORMAT_ACTIONS``) still gets ActionsPayload models."""
    prompts: list[str] = []

    async def llm(prompt: str) -> str:
        prompts.append(prompt)
        return "A summary."

    seen: list[type] = []

    def users_formatter(payloads: list[ActionsPayload]) -> str:
        seen.extend(type(p) for p in payloads)
        return default_format_actions(payloads)

    model = request_of(1, 6)
    structs = decode_request(encode(model)).batches
    assert structs and not isinstance(structs[0], ActionsPayload)
    for formatter in (default_format_actions, users_formatter):
        summarizer = LLMSummarizer(
            ResilientLLM.from_settings(llm, Settings()),
            template=DEFAULT_PROMPT,
            formatter=formatter,
            max_chars=500,
        )
        await summarizer.summarize("Before.", structs, total=6)
        await summarizer.summarize("Before.", model.batches, total=6)
    assert prompts[0] == prompts[1] == prompts[2] == prompts[3]
    assert "4. [0] error: Export failed — /page/1\n5. [0] click: clicked button 5" in prompts[0]
    assert seen == [ActionsPayload, ActionsPayload]


class _SpyPii(PiiFilter):
    """The PII filter, recording every text it is asked to filter."""

    def __init__(self) -> None:
        super().__init__(key=b"a-test-key-0123456789")
        self.texts: list[str] = []

    def redact_text(self, text: str, session_key: str, policy: str = "text") -> str:
        self.texts.append(text)
        return super().redact_text(text, session_key, policy)


def _spied(llm: Any, formatter: Any = default_format_actions) -> tuple[LLMSummarizer, _SpyPii]:
    pii = _SpyPii()
    resilient = ResilientLLM.from_settings(llm, Settings())
    summarizer = LLMSummarizer(
        resilient, template=DEFAULT_PROMPT, formatter=formatter, max_chars=500, pii=pii
    )
    return summarizer, pii


async def test_the_pii_pass_skips_only_summaries_its_model_wrote() -> None:
    """A summary the model wrote from filtered input is not filtered again as the next
    prompt's previous summary (0.6-1.5 ms a 1,500-char summary); any other previous is: an
    offline fold from raw actions, one from before a restart, another session's."""
    answers = iter(["Model wrote: user exported twice.", "Model wrote more.", "x", "y"])
    prompts: list[str] = []

    async def llm(prompt: str) -> str:
        prompts.append(prompt)
        return next(answers)

    summarizer, pii = _spied(llm)
    first = await summarizer.summarize(None, request_of(1, 4).batches, total=4)
    await summarizer.summarize(str(first), request_of(5, 4).batches, total=8)
    assert str(first) not in pii.texts  # the model's own words: not scanned again

    raw_fold = "Offline: mailed bob@corp.io"  # e.g. offline_fold over raw actions
    await summarizer.summarize(raw_fold, request_of(9, 4).batches, total=12)
    assert raw_fold in pii.texts and "bob@corp.io" not in prompts[-1] and "<EMAIL_" in prompts[-1]

    other = [ActionsPayload.model_validate({**batch(1, 2), "session_id": "s2"})]
    await summarizer.summarize(str(first), other, total=2)  # s1's summary, seen in s2
    assert pii.texts.count(str(first)) == 1


_PII_EVERYWHERE = {
    "session_id": "s1",
    "user_id": "ann@corp.io",
    "email": "ann@corp.io",
    "actions": [
        {
            "type": "input",
            "title": "Called (415) 555-0132",
            "description": "Mailed ann@corp.io the card 4111 1111 1111 1111",
            "canonical_url": "https://app.example.com/u/ann@corp.io",
            "raw_url": "https://app.example.com/u?token=abc123xyz&phone=4155550132",
            "user_id": "ann@corp.io",
            "email": "ann@corp.io",
        }
    ],
}


async def test_the_default_prompt_is_filtered_on_the_fields_it_reads() -> None:
    """The default formatter reads a few fields (``ACTION_TEXT_FIELDS``): only those are
    filtered, the same prompt as filtering every field; a user's formatter gets all filtered."""
    from agents.summarizer.prompting import build_prompt

    prompts: list[str] = []

    async def llm(prompt: str) -> str:
        prompts.append(prompt)
        return "ok"

    def raw_urls(payloads: list[ActionsPayload]) -> str:  # a user's formatter
        return "\n".join(a.raw_url or "" for p in payloads for a in p.actions)

    payloads = [ActionsPayload.model_validate(_PII_EVERYWHERE)]
    for formatter in (default_format_actions, raw_urls):
        summarizer, pii = _spied(llm, formatter)
        await summarizer.summarize(None, payloads, total=1)
        scanned = list(pii.texts)
        everything = build_prompt(DEFAULT_PROMPT, None, pii.redact(payloads, "s1"), formatter)
        assert prompts[-1] == everything
        for secret in ("555-0132", "ann@corp.io", "4111", "abc123xyz"):
            assert secret not in prompts[-1]
        raw_url = payloads[0].actions[0].raw_url
        assert (raw_url in scanned) == (formatter is raw_urls), scanned
    assert "<TOKEN_" in prompts[-1] and "<EMAIL_" in prompts[0] and "<CARD_" in prompts[0]


def test_action_text_reads_only_action_text_fields() -> None:
    """``ACTION_TEXT_FIELDS`` names every field ``action_text`` reads: the default prompt's
    PII pass filters those only, so a field it reads and does not list would go unfiltered."""
    from schemas.actions import ACTION_TEXT_FIELDS, SlimAction, action_text

    action = SlimAction.model_validate({"type": "click", "index": 7})
    fields = {
        name: f"<{name}-marker>"
        for name, info in SlimAction.model_fields.items()
        if info.annotation in (str, str | None)
    }
    text = action_text(action.model_copy(update=fields))
    for name, marker in fields.items():
        assert (marker in text) == (name in ACTION_TEXT_FIELDS), name


def test_a_request_whose_action_says_session_erased_is_a_request() -> None:
    """The stage took any message holding ``"session_erased"`` for an erasure and refused a
    request whose action's text was just that: dead-lettered, its actions never summarised."""
    from agents.summarize.state import decode_request as take

    raw = encode(request_of(1, 2)).replace(b'"clicked button 1"', b'"session_erased"')
    decoded = take(raw)
    assert not isinstance(decoded, SessionErased)
    assert decoded.batches[0].actions[0].description == "session_erased"
    erased = SessionErased(session_id="s1", requested_at=1.0, emitted_at=2.0)
    assert take(encode(erased)) == erased
    with pytest.raises(InvalidMessage, match="session_id"):
        take(b'{"op":"session_erased"}')
