"""The vector sink: summaries embedded and upserted, searched, and used to enrich a query."""

from __future__ import annotations

from pathlib import Path

import pytest
from autoplay_sdk import ActionsPayload as SDKActionsPayload
from autoplay_sdk.context.context_store import ContextStore as SDKContextStore

from schemas import ActionsPayload, ActionsWritten, SummaryReady
from sinks.context import SessionContext
from sinks.registry import load_sink
from sinks.vector import CallbackStore, LanceStore, VectorSink, WordLlamaEmbedder, enrich_text
from sinks.vector.routes import search_sessions
from streams.settings import Settings
from tests.support import vector_callables

TOPICS = {
    "a": "exported the quarterly revenue report as CSV",
    "b": "invited a teammate to the workspace",
    "c": "connected the Salesforce integration and saw an OAuth error",
}


def payload(sid: str, seq_from: int, titles: list[str], product: str = "p1") -> ActionsPayload:
    return ActionsPayload.model_validate(
        {
            "session_id": sid,
            "product_id": product,
            "user_id": f"u-{sid}",
            "actions": [
                {"index": i, "type": "click", "title": t, "description": t, "canonical_url": "/x"}
                for i, t in enumerate(titles)
            ],
        }
    )


def written(sid: str, seq_from: int, titles: list[str], product: str = "p1") -> ActionsWritten:
    body = payload(sid, seq_from, titles, product)
    return ActionsWritten(
        session_id=sid,
        product_id=product,
        seq_from=seq_from,
        seq_to=seq_from + len(titles) - 1,
        text=body.numbered_text(seq_from),
        payload=body,
        emitted_at=1.0,
    )


def summary(sid: str, seq_to: int, text: str, product: str = "p1") -> SummaryReady:
    return SummaryReady(
        session_id=sid,
        product_id=product,
        seq_from=1,
        seq_to=seq_to,
        window_from=1,
        summary=text,
        emitted_at=2.0,
    )


async def run(sink: VectorSink, ops: list[ActionsWritten | SummaryReady]) -> SessionContext:
    context = SessionContext(session_id=ops[0].session_id)
    for op in ops:
        context = context.advanced(op)
        await sink.apply(op, context)
    return context


@pytest.fixture
async def lance_sink(tmp_path: Path):  # type: ignore[no-untyped-def]
    sink = VectorSink(LanceStore(tmp_path / "vector"), WordLlamaEmbedder(), embed_batches=True)
    await sink.setup()
    yield sink
    await sink.aclose()


async def test_current_summaries_once_superseded_gone_and_replays_add_nothing(
    lance_sink: VectorSink,
) -> None:
    store = lance_sink.store
    assert isinstance(store, LanceStore)
    contexts = {}
    for sid, topic in TOPICS.items():
        ops = [
            written(sid, 1, ["opened the dashboard", "clicked around"]),
            summary(sid, 2, "The user opened the dashboard."),
            written(sid, 3, [topic]),
            summary(sid, 3, f"The user {topic}."),
            written(sid, 4, ["scrolled"]),  # raw, after the summary
        ]
        contexts[sid] = await run(lance_sink, ops)
        # A redelivery after a crash: the last summary applied again to the context
        # saved before it (its bookkeeping still names the summary it replaced).
        before = SessionContext(session_id=sid)
        for op in ops[:3]:
            before = before.advanced(op)
        await lance_sink.apply(ops[3], before.advanced(ops[3]))
    assert await store.count("kind = 'summary'") == 3
    assert await store.count("kind = 'actions'") == 3  # only the batches after each summary
    assert await store.count("seq_to = 2") == 0  # superseded summaries and batches are gone
    hits = await search_sessions(
        lance_sink, "export the revenue report to CSV", k=3, product_id="p1"
    )
    assert hits[0].meta["session_id"] == "a"
    assert {h.meta["session_id"] for h in hits} == set(TOPICS)
    assert hits[0].score > hits[-1].score
    assert await search_sessions(lance_sink, "revenue", k=3, product_id="other") == []


async def test_the_sdk_callables_plug_in_unchanged_and_flag_superseded_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AC_VECTOR_EMBED", "tests.support.vector_callables:embed")
    monkeypatch.setenv("AC_VECTOR_UPSERT", "tests.support.vector_callables.upsert")
    vector_callables.INDEX.clear()
    sink = load_sink("vector", Settings(data_dir=tmp_path))
    assert isinstance(sink, VectorSink) and isinstance(sink.store, CallbackStore)
    await sink.setup()  # type: ignore[attr-defined]
    await run(sink, [written("s", 1, ["x", "y"]), summary("s", 2, "one"), summary("s", 3, "two")])
    await sink.aclose()  # type: ignore[attr-defined]
    current = [m for _, m in vector_callables.INDEX.values() if not m["superseded"]]
    assert [(m["kind"], m["seq_to"], m["product_id"], m["user_id"]) for m in current] == [
        ("summary", 3, "p1", "u-s")
    ]
    assert len(vector_callables.INDEX) == 2  # the first summary is kept, flagged superseded


def test_enrich_is_the_sdk_format_with_only_the_actions_after_the_summary() -> None:
    ops = [
        written("e", 1, ["opened billing", "clicked upgrade"]),
        summary("e", 2, "The user looked at upgrading."),
        written("e", 3, ["added a seat", "paid"]),
    ]
    context = SessionContext(session_id="e")
    for op in ops:
        context = context.advanced(op)
    ours = enrich_text(context, "How do I add a team member?")

    # The SDK's store given the same summary and, as its indexes, our sequence numbers.
    sdk = SDKContextStore()
    sdk.on_summary("e", "The user looked at upgrading.")
    after = payload("e", 3, ["added a seat", "paid"]).model_dump()
    for i, action in enumerate(after["actions"]):
        action["index"] = 3 + i
    sdk.add(SDKActionsPayload.from_dict({**after, "type": "actions"}))
    assert ours == sdk.enrich("e", "How do I add a team member?")
    assert "opened billing" not in ours  # summarised: never twice
    assert enrich_text(SessionContext(session_id="none"), "q") == "q"


async def test_sinks_run_the_sdk_hooks_at_setup_and_aclose(tmp_path: Path) -> None:
    vector_callables.HOOKS.clear()
    sdk_module = load_sink("tests.support.vector_callables", Settings(data_dir=tmp_path))
    await sdk_module.setup()  # type: ignore[attr-defined]
    await sdk_module.aclose()  # type: ignore[attr-defined]
    assert vector_callables.HOOKS == [("connect",), ("disconnect", "stopped")]
