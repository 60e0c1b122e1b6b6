"""A summarize request read compiled (agents/summarize/compiled.py) gives what the stage's
Python passes give: the ledger ``count_batches`` counts (merged by ``merge_facts``), the
prompt's actions ``default_format_actions`` writes, the texts the PII pass would filter,
the conversation; or it declines (None, or no facts) and the Python passes run."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.structs import asdict

from agents.accumulate.state import Limits, MemoryBatchStore, apply_payload
from agents.summarize.compiled import (
    LazyBatches,
    ReadRequest,
    RequestReader,
    merge_facts,
    request_of_read,
)
from agents.summarize.state import conversation_id, decode_request
from agents.summarizer import LLMSummarizer, ResilientLLM
from agents.summarizer.prompting import DEFAULT_PROMPT, default_format_actions
from schemas import InvalidMessage, fast
from schemas.fast import decode_payload
from schemas.ledger import LedgerLimits, count_batches, new_ledger
from scripts.bench.workload import workload
from streams.native import native
from streams.settings import Settings
from tests.unit.test_compiled import CARGO
from tests.unit.test_fast_exact import anything, dumps, payloads

pytestmark = pytest.mark.skipif(
    native is None and not CARGO, reason="no Rust toolchain: the Python passes alone"
)
LIMITS = LedgerLimits(top_pages=4, key_actions=3, errors=2)  # small: bounds reached early

# Texts in which the default patterns find errors and key actions, or not; ASCII mostly.
words = st.sampled_from(["Error", "failed", "Button", "export", "view", "a", "", " ", "é", "\n"])
texts = st.lists(words, max_size=4).map(" ".join) | st.text(max_size=6)
times = st.sampled_from([0.0, -0.0, 1.5, 1764856000.25, -3.0]) | st.floats(0, 2e9)
actions = st.fixed_dictionaries(
    {
        "title": texts,
        "description": texts,
        "canonical_url": st.sampled_from(["", "/a", "/b", "/c", "/d", "/e", "/ü"]),
        "raw_url": st.sampled_from(["", "/raw"]),
        "index": st.integers(-5, 2**40),
        "type": st.sampled_from(["", "click", "error", "submit"]),
        "timestamp_start": times,
        "timestamp_end": times,
    },
    optional={"conversation_id": st.none() | st.sampled_from(["", "c1"])},
)
batches = st.fixed_dictionaries(
    {
        "session_id": st.just("s") | st.just("s") | st.just("t"),
        "actions": st.lists(actions, max_size=4),
    },
    optional={
        "forwarded_at": times,
        "conversation_id": st.none() | st.sampled_from(["", "c2", "c3"]),
        "user_id": st.none() | st.just("u"),
    },
)


def _ledgers() -> list[dict[str, Any]]:
    """Where a request's facts are merged: a new session, one three pages in, one full."""
    start = []
    for pages in (0, 3, 4):
        ledger = new_ledger()
        acts = [
            (decode_payload(orjson.dumps({"session_id": "s", "actions": [a]})).actions[0])
            for a in ({"canonical_url": f"/p{n}", "type": "error"} for n in range(pages))
        ]
        count_batches(ledger, [(acts, 7.0)], 1, LIMITS)
        start.append(ledger)
    return start


LEDGERS = _ledgers()


def _request(batches: list[dict[str, Any]], seq_from: int, created_at: float) -> bytes:
    count = sum(len(b["actions"]) for b in batches)
    request = {
        "session_id": "s",
        "product_id": "p",
        "generation": 0,
        "seq_from": seq_from,
        "seq_to": seq_from + max(count, 1) - 1,
        "batches": batches,
        "final": False,
        "created_at": created_at,
    }
    return orjson.dumps(request)


def same_passes(raw: bytes, reader: RequestReader, limits: LedgerLimits = LIMITS) -> str:
    """The read's parts against the Python passes; what the read gave ("facts", "prompt",
    "declined", "refused": the stage dead-letters it, nothing is read)."""
    try:
        request = decode_request(raw)
    except InvalidMessage:
        return "refused"
    read = reader(raw)
    if read is None:
        return "declined"
    same_request(raw, read)
    payloads = request.batches
    assert read.formatted.text == default_format_actions(payloads)
    assert read.conversation == conversation_id(payloads)
    for name, found in (
        ("description", read.formatted.descriptions),
        ("canonical_url", read.formatted.urls),
    ):
        held = {getattr(a, name) for p in payloads for a in p.actions} - {""}
        assert sorted(found) == sorted(held), name  # each once
    if read.facts is None:
        return "prompt"
    for start in LEDGERS:
        counted, merged = copy.deepcopy(start), copy.deepcopy(start)
        batches = ((b.actions, b.forwarded_at or request.created_at) for b in payloads)
        count_batches(counted, batches, request.seq_from, limits)
        if merge_facts(merged, read.facts, limits):
            assert orjson.dumps(merged) == orjson.dumps(counted)  # 1.0 is not 1
        else:
            assert merged == start  # untouched: the caller counts
    return "facts"


@settings(max_examples=400, deadline=None)
@given(st.lists(batches, max_size=4), st.integers(1, 30), times)
def test_a_request_read_compiled_gives_what_the_python_passes_give(
    batches: list[dict[str, Any]], seq_from: int, created_at: float
) -> None:
    raw = _request(batches, seq_from, created_at)
    outcome = same_passes(raw, RequestReader(LIMITS))
    if outcome == "declined":  # only a batch of another session
        assert any(b["session_id"] != "s" for b in batches)


def test_the_edges_decline_or_give_no_facts() -> None:
    reader = RequestReader(LIMITS)
    plain = [{"session_id": "s", "actions": [{"title": "Button", "canonical_url": "/a"}]}]
    assert same_passes(_request(plain, 1, 5.0), reader) == "facts"
    for changed in (
        {"title": "Bütton"},  # beyond ASCII: the prompt, no facts
        {"timestamp_end": -0.0},
        {"timestamp_start": -1.0},
        {"canonical_url": "/a\n"},
    ):
        actions = [{**plain[0]["actions"][0], **changed}]
        raw = _request([{"session_id": "s", "actions": actions}], 1, 5.0)
        assert same_passes(raw, reader) == "prompt", changed
    legacy = {**orjson.loads(_request(plain, 1, 5.0)), "ledger": new_ledger()}
    assert reader(orjson.dumps(legacy)) is None  # a request before session 21: its ledger
    assert reader(orjson.dumps({**legacy, "extra": 1})) is None
    # A user's patterns: the regexes of Rust may not read them as re does.
    user = LedgerLimits(key_pattern=r"(?i)\bbutton\b")
    read = RequestReader(user)(_request(plain, 1, 5.0))
    assert read is not None and read.facts is None
    assert RequestReader(LIMITS, enabled=False)(_request(plain, 1, 5.0)) is None


def test_the_workload_is_read_and_merged_whole() -> None:
    """The bench's requests (and a real app's, with ids) take the compiled passes, every one."""
    limits = LedgerLimits()
    reader = RequestReader(limits)
    for ids in (False, True):
        acc = Limits(threshold=10, max_actions_per_batch=Settings().max_actions_per_batch)
        store, states, outcomes = MemoryBatchStore(), dict[str, Any](), []
        for offset, data in enumerate(workload(3000, 40, 1, min_batch=1, max_batch=3, ids=ids)):
            payload = decode_payload(orjson.dumps(data))
            sid = payload.session_id
            states[sid], out = apply_payload(states.get(sid), payload, offset, acc, store=store)
            outcomes += [
                same_passes(e.value, reader, limits) for e in out if e.topic == "summarize"
            ]
        assert len(outcomes) > 200 and set(outcomes) == {"facts"}


async def test_the_prompt_made_already_is_the_prompt_and_pii_still_wins() -> None:
    """The summarizer takes the actions made already where the PII pass would leave each of
    their texts: the same prompt; a text it would change sends it down the Python pass,
    which counts the detection once."""
    from prometheus_client import REGISTRY

    from agents.pii import PiiFilter

    def emails() -> float:
        return REGISTRY.get_sample_value("ac_pii_detections_total", {"type": "EMAIL"}) or 0.0

    prompts: list[str] = []

    async def llm(prompt: str) -> str:
        prompts.append(prompt)
        return "summary"

    def summarizer() -> LLMSummarizer:
        resilient = ResilientLLM.from_settings(llm, Settings())
        pii = PiiFilter(key=b"a-test-key-0123456789")
        return LLMSummarizer(
            resilient,
            template=DEFAULT_PROMPT,
            formatter=default_format_actions,
            max_chars=500,
            pii=pii,
        )

    for description in ("Clicked export", "Mailed ann@corp.io"):
        action = {"title": "t", "description": description, "canonical_url": "/a"}
        raw = _request([{"session_id": "s", "actions": [action]}], 1, 5.0)
        read = RequestReader(LIMITS)(raw)
        assert read is not None
        payloads = decode_request(raw).batches
        before = emails()
        await summarizer().summarize("before", payloads, total=1)
        await summarizer().summarize("before", payloads, total=1, formatted=read.formatted)
        assert prompts[-1] == prompts[-2]
        found = emails() - before
        assert (found, "ann@corp.io" in prompts[-1]) == (
            (2, False) if "@" in description else (0, False)
        )


def _mutated(base: bytes, where: str, value: Any) -> bytes:
    data = orjson.loads(base)
    batch = data["batches"][0]
    if where == "action":
        batch["actions"][0]["title"] = value
    elif where == "action_field":
        batch["actions"][0]["zz"] = value
    elif where.startswith("request."):
        data[where.removeprefix("request.")] = value
    else:
        batch[where] = value
    return dumps(data)


BASE = _request(
    [{"session_id": "s", "actions": [{"title": "t", "index": 3}], "forwarded_at": 2.0}], 1, 5.0
)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(
        ["action", "action_field", "forwarded_at", "count", "email", "type"]
        + [f"request.{name}" for name in orjson.loads(BASE)]
        + ["request.ledger", "request.zz"]
    ),
    anything,
)
def test_what_the_read_takes_the_strict_structs_take_alike(where: str, value: Any) -> None:
    """The stage builds a read request from the read's values (``request_of_read``) and
    decodes its batches when first read: the request a whole decode gives, never one it
    refuses."""
    raw = _mutated(BASE, where, value)
    read = RequestReader(LIMITS)(raw)
    if read is None:
        return
    same_request(raw, read)


def same_request(raw: bytes, read: ReadRequest) -> None:
    """The request built from the read is the one a whole decode gives (None: the stage
    decodes it whole, as without the read)."""
    built = request_of_read(raw, read.head, read.batches)
    if built is None:
        return
    whole = fast.decode_request(raw)  # raises if the read took what the Structs refuse
    assert isinstance(built.batches, LazyBatches) and len(built.batches) == len(whole.batches)
    assert repr({**asdict(built), "batches": None}) == repr({**asdict(whole), "batches": None})
    assert list(built.batches) == whole.batches


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(payloads, st.booleans()), max_size=3))
def test_generated_batches_read_only_where_they_decode_alike(batches: list[Any]) -> None:
    ours = [{**b, "session_id": "s"} if ours else b for b, ours in batches]  # mostly read
    raw = dumps({**orjson.loads(BASE), "batches": ours, "seq_to": 40})
    read = RequestReader(LIMITS)(raw)
    if read is not None:
        same_request(raw, read)
