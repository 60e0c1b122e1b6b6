"""The summarize agent's state: actions of failed requests carried forward, bounded."""

from __future__ import annotations

from typing import Any

from agents.summarize import CARRY_MAX_BYTES, SummaryState, fold_large_carry
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
