"""The accumulator's pure transitions: sequence numbers, thresholds, debounce, idle."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any, cast

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.accumulate.batches import TableBatches
from agents.accumulate.state import (
    Limits,
    MemoryBatchStore,
    SessionState,
    _latest_end,
    already_applied,
    apply_payload,
    close_idle,
    debounce_due,
    flush_debounce,
)
from agents.summarize.state import SummaryState
from schemas import ActionsPayload, ActionsWritten, SummarizeRequest
from schemas.fast import Payload, encode_payload, payload_struct
from streams.tables import DecodedEntries, batch_key


def payload(n: int, sid: str = "s1", start: int = 0) -> Payload:
    return payload_struct(
        ActionsPayload.model_validate(
            {
                "session_id": sid,
                "product_id": "p",
                "actions": [
                    {"title": f"a{i}", "description": f"did {i}", "canonical_url": "/x", "index": i}
                    for i in range(start, start + n)
                ],
            }
        )
    )


def payload_bytes(index: int) -> bytes:
    return encode_payload(payload(1, start=index))


def decode_all(emissions):  # type: ignore[no-untyped-def]
    out = []
    for e in emissions:
        model = ActionsWritten if e.topic == "context" else SummarizeRequest
        out.append(model.model_validate(orjson.loads(e.value)))
    return out


def test_sequence_numbers_are_contiguous_and_threshold_counts_actions() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=5, max_actions_per_batch=100)
    state, out = apply_payload(None, payload(3), offset=10, limits=limits, now=1.0, store=store)
    first = decode_all(out)
    assert [(o.seq_from, o.seq_to) for o in first] == [(1, 3)]
    state, out = apply_payload(
        state, payload(4, start=3), offset=11, limits=limits, now=2.0, store=store
    )
    written, request = decode_all(out)
    assert (written.seq_from, written.seq_to) == (4, 7)
    assert isinstance(request, SummarizeRequest)
    assert (request.seq_from, request.seq_to, request.action_count) == (1, 7, 7)
    assert [len(b.actions) for b in request.batches] == [3, 4]
    assert (
        state.pending_batches == 0
        and state.summarized_to == 7
        and state.generation == 10
        and state.batch_slots == 2  # the batches stay in their slots for the next to reuse
        # slot 1's batch was taken at once by its request: never stored
        and set(store.batches) == {batch_key("s1", 0)}
    )


def test_slots_are_reused_after_each_request_and_deleted_at_the_close() -> None:
    """No deletion per summarised batch: the next batches overwrite its slots from 0,
    and the close deletes every slot the session used (none is left behind)."""
    store = MemoryBatchStore()
    limits = Limits(threshold=4, max_actions_per_batch=100)
    state, requests = None, []
    for n in range(12):  # 24 actions: 6 requests of 2 batches each
        state, out = apply_payload(
            state, payload(2, start=2 * n), offset=n, limits=limits, now=0.0, store=store
        )
        requests += [o for o in decode_all(out) if isinstance(o, SummarizeRequest)]
        assert set(store.batches) <= {batch_key("s1", 0), batch_key("s1", 1)}
    assert [[a.index for b in r.batches for a in b.actions] for r in requests] == [
        list(range(4 * i, 4 * i + 4)) for i in range(6)
    ]
    assert state is not None
    state, _ = apply_payload(
        state, payload(1, start=24), offset=12, limits=limits, now=0.0, store=store
    )
    (final,) = decode_all(close_idle(state, "s1", limits, 400.0, store))
    assert final.final and [a.index for b in final.batches for a in b.actions] == [24]
    assert store.batches == {}


def test_a_state_saved_before_slots_deletes_its_old_indexes_at_the_close() -> None:
    """A session entry written before slots were reused (no ``batch_slots``, its pending
    batches at indexes 30-32, the ones below already deleted) still leaves nothing."""
    store = MemoryBatchStore()
    limits = Limits(threshold=100, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(1), offset=0, limits=limits, now=0.0, store=store)
    store.batches.clear()
    entry = orjson.loads(state.to_bytes())
    del entry["batch_slots"]
    entry |= {"first_batch": 30, "next_batch": 33, "next_seq": 4, "pending_actions": 3}
    old = SessionState.from_bytes(orjson.dumps(entry))
    for i in range(30, 33):
        store.put("s1", i, payload_bytes(i))
    (final,) = decode_all(close_idle(old, "s1", limits, 400.0, store))
    assert [a.index for b in final.batches for a in b.actions] == [30, 31, 32]
    assert store.batches == {}


def test_a_replay_over_reused_slots_repeats_the_request_it_replays() -> None:
    """kill -9 between a unit's batch writes and its session entry: the durable entry is
    from before a request whose slot a later batch already overwrote. Replayed, that
    request is built from the overwritten slot, but it repeats the range of the request
    made before the crash (durable before any overwrite: outputs are acknowledged before
    table writes), so the summarize stage skips it; the state then converges."""
    limits = Limits(threshold=4, max_actions_per_batch=100)
    store = MemoryBatchStore()
    state, _ = apply_payload(None, payload(2), offset=0, limits=limits, now=0.0, store=store)
    durable_entry, first_slot = state.to_bytes(), store.batches[batch_key("s1", 0)]
    state, out = apply_payload(
        state, payload(2, start=2), offset=1, limits=limits, now=0.0, store=store
    )
    (request,) = [o for o in decode_all(out) if isinstance(o, SummarizeRequest)]
    state, _ = apply_payload(
        state, payload(2, start=4), offset=2, limits=limits, now=0.0, store=store
    )
    assert store.batches[batch_key("s1", 0)] != first_slot  # slot 0 overwritten
    unbroken, unbroken_store = state, dict(store.batches)

    # The crash: the batches are durable, the session entry is the one before offset 1.
    replayed = SessionState.from_bytes(durable_entry)
    replayed, out = apply_payload(
        replayed, payload(2, start=2), offset=1, limits=limits, now=0.0, store=store
    )
    (again,) = [o for o in decode_all(out) if isinstance(o, SummarizeRequest)]
    assert (again.seq_from, again.seq_to) == (request.seq_from, request.seq_to)
    summaries = SummaryState(generation=0, requested_to=request.seq_to)  # after the original
    assert summaries.replayed(again)
    replayed, _ = apply_payload(
        replayed, payload(2, start=4), offset=2, limits=limits, now=0.0, store=store
    )
    assert replayed == unbroken and store.batches == unbroken_store
    replayed, out = apply_payload(
        replayed, payload(2, start=6), offset=3, limits=limits, now=0.0, store=store
    )
    (after,) = [o for o in decode_all(out) if isinstance(o, SummarizeRequest)]
    assert [a.index for b in after.batches for a in b.actions] == [4, 5, 6, 7]


def test_a_replayed_offset_is_recognised() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=5, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(1), offset=7, limits=limits, now=1.0, store=store)
    assert already_applied(state, 7) and already_applied(state, 3)
    assert not already_applied(state, 8) and not already_applied(None, 0)


def test_state_survives_its_table_encoding() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=50, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(2), offset=1, limits=limits, now=1.0, store=store)
    assert SessionState.from_bytes(state.to_bytes()) == state


def test_oversized_batches_are_split_and_never_exceed_the_cap() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=1000, max_actions_per_batch=4)
    _, out = apply_payload(None, payload(10), offset=1, limits=limits, now=1.0, store=store)
    ranges = [(o.seq_from, o.seq_to) for o in decode_all(out)]
    assert ranges == [(1, 4), (5, 8), (9, 10)]


def test_debounce_merges_with_sdk_semantics_and_flushes_on_max_wait() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=100, max_actions_per_batch=100, debounce_ms=200, debounce_max_ms=500)
    state, out = apply_payload(None, payload(2), offset=1, limits=limits, now=0.0, store=store)
    assert out == []
    for i, t in enumerate((0.1, 0.2, 0.3, 0.4)):  # steady traffic: never 200 ms quiet
        state, out = apply_payload(
            state, payload(1, start=2 + i), offset=2 + i, limits=limits, now=t, store=store
        )
        assert out == []
    assert not debounce_due(state, limits, now=0.45)
    assert debounce_due(state, limits, now=0.5)  # the max wait flushes anyway
    (merged,) = decode_all(flush_debounce(state, limits, 0.5, store))
    assert (merged.seq_from, merged.seq_to) == (1, 6)
    assert [a.index for a in merged.payload.actions] == [
        0,
        1,
        2,
        3,
        4,
        5,
    ]  # re-indexed, like merge()


def test_idle_close_summarises_what_is_pending() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=10, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(3), offset=5, limits=limits, now=0.0, store=store)
    (request,) = decode_all(close_idle(state, "s1", limits, 400.0, store))
    assert request.final and (request.seq_from, request.seq_to) == (1, 3)
    # Closed again with nothing pending: still a final, empty (it ends the summary state).
    (again,) = decode_all(close_idle(state, "s1", limits, 401.0, store))
    assert again.final and again.closes_only and again.batches == []


def test_changelog_bytes_per_payload_do_not_grow_with_the_pending_batches() -> None:
    """O(1) per action: the session entry stays the same size as batches pile up."""
    store = MemoryBatchStore()
    limits = Limits(threshold=1000, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(2), offset=0, limits=limits, now=0.0, store=store)
    first = len(state.to_bytes())
    for n in range(1, 200):
        state, _ = apply_payload(
            state, payload(2, start=2 * n), offset=n, limits=limits, now=0.0, store=store
        )
    assert state.pending_batches == 200 and len(store.batches) == 200
    # A few more digits in the counters (the ledger's too); its lists are bounded.
    assert len(state.to_bytes()) <= first + 48


def test_a_summary_is_requested_early_when_pending_batches_would_not_fit_a_message() -> None:
    store = MemoryBatchStore()
    limits = Limits(threshold=1000, max_actions_per_batch=100, max_pending_bytes=2000)
    state, emitted = None, []
    for n in range(20):
        state, out = apply_payload(
            state, payload(3, start=3 * n), offset=n, limits=limits, now=0.0, store=store
        )
        emitted += decode_all(out)
    requests = [o for o in emitted if isinstance(o, SummarizeRequest)]
    assert requests, "no early summary although the pending batches outgrew the budget"
    assert all(len(r.model_dump_json()) < 2000 + 1000 for r in requests)
    covered = [(r.seq_from, r.seq_to) for r in requests]
    assert covered[0][0] == 1
    assert all(b[0] == a[1] + 1 for a, b in itertools.pairwise(covered))
    assert state is not None and state.summarized_to == covered[-1][1]


# A session entry as the worker before msgspec (45bd0c6) wrote it: debounced payloads, a ledger.
OLD_ENTRY = (
    b'{"generation":7,"product_id":"p","conversation_id":"c","next_seq":3,"last_offset":8,'
    b'"summarized_to":0,"first_batch":0,"next_batch":1,"pending_actions":2,"pending_bytes":586,'
    b'"debounce":[{"product_id":"p","session_id":"s","user_id":null,"email":null,"actions":'
    b'[{"title":"Submit form","description":"Upgrade plan","canonical_url":"/billing","index":0,'
    b'"type":"submit","timestamp_start":0.0,"timestamp_end":0.0,"raw_url":"","session_id":null,'
    b'"user_id":null,"email":null,"conversation_id":null}],"count":1,"forwarded_at":0.0,'
    b'"conversation_id":"c"}],"debounce_first":100.0,"debounce_last":100.0,"last_seen":101.0,'
    b'"ingested_at":100.5,"ledger":{"actions":2,"batches":1,"first_at":101.0,"last_at":101.0,'
    b'"pages":{"/billing":2},"other_page_actions":0,"errors":[],"errors_total":0,"key_actions":'
    b'[{"seq":1,"text":"submit: Upgrade plan"},{"seq":2,"text":"submit: Upgrade plan"}],'
    b'"key_actions_total":2,"first_step":{"seq":1,"text":"submit: Upgrade plan"},'
    b'"last_step":{"seq":2,"text":"submit: Upgrade plan"}}}'
)


def test_an_upgraded_worker_reads_the_old_changelogs_entries() -> None:
    older = orjson.dumps({k: v for k, v in orjson.loads(OLD_ENTRY).items() if k != "ledger"})
    odd = OLD_ENTRY.replace(b'"last_seen":101.0', b'"last_seen":"101"')  # not the declared type
    for raw in (OLD_ENTRY, older, odd):
        state = SessionState.from_bytes(raw)
        # The ledger is counted at the summarize stage since session 21: left out here.
        kept = SessionState(**{k: v for k, v in orjson.loads(raw).items() if k != "ledger"})
        assert state == kept
        assert [type(v) for v in vars(state).values()] == [type(v) for v in vars(kept).values()]
        assert state.to_bytes() == orjson.dumps(kept)
    summary = b'{"generation":3,"summary":"s","covered_to":10,"requested_to":10,"carry":[],'
    summary += b'"carry_from":null,"closed":false,"updated_at":5.0}'
    assert SummaryState.from_bytes(summary) == SummaryState(**orjson.loads(summary))


def test_a_kept_state_is_handed_out_once_and_only_for_the_bytes_it_was_saved_as() -> None:
    states = DecodedEntries(SessionState.from_bytes, limit=2)
    store = MemoryBatchStore()
    limits = Limits(threshold=50, max_actions_per_batch=100)
    state, _ = apply_payload(None, payload(2), offset=1, limits=limits, now=1.0, store=store)
    raw = state.to_bytes()
    states.keep("s1", raw, state)
    assert states.take("s1", raw) is state
    again = states.take("s1", raw)  # handed out already (its taker may have changed it)
    assert again is not state and again == SessionState.from_bytes(raw)
    states.keep("s1", raw, state)
    # Equal bytes (a store's compact copy, RocksDB's read) decode to an equal state: kept.
    assert states.take("s1", bytes(bytearray(raw))) is state
    states.keep("s1", raw, state)
    other = SessionState.from_bytes(raw)
    other.next_seq += 1
    assert states.take("s1", other.to_bytes()) == other  # written since: decoded
    states.keep("s1", raw, state)
    assert states.take("s1", None) is None  # the session is gone
    for sid in ("a", "b", "c"):
        states.keep(sid, raw, state)
    assert states.take("a", raw) is not state  # the oldest of three went (limit 2)
    assert states.take("c", raw) is state


class RecordedWrites:
    """The two calls ``TableBatches`` makes of a ``WriteBehind``, recorded."""

    def __init__(self) -> None:
        self.values: dict[str, bytes | None] = {}
        self.log: list[tuple[str, bytes | None]] = []

    def get(self, table: object, key: str) -> bytes | None:
        return self.values.get(key)

    def set(self, table: object, key: str, value: bytes | None, *, exact: bool = False) -> None:
        self.values[key] = value
        self.log.append((key, value))


def test_the_table_store_writes_no_tombstone_until_the_close() -> None:
    """Changelog records: one per batch, none per summarised batch, one per slot at the close."""
    writes = RecordedWrites()
    store = TableBatches(cast(Any, object()), cast(Any, writes))
    limits = Limits(threshold=4, max_actions_per_batch=100)
    state = None
    for n in range(8):  # 16 actions, 4 requests
        state, _ = apply_payload(
            state, payload(2, start=2 * n), offset=n, limits=limits, now=0.0, store=store
        )
        store.commit("s1", state.to_bytes())
    assert state is not None and state.batch_slots == 2
    # The second batch of each request is taken in its own change: never written.
    batches = [(key, value) for key, value in writes.log if key != "s1"]
    assert [key for key, _ in batches] == [batch_key("s1", 0)] * 4
    assert all(value is not None for _, value in batches)
    writes.log.clear()
    close_idle(state, "s1", limits, 400.0, store)
    store.commit("s1", None)
    assert writes.log == [("s1", None), (batch_key("s1", 0), None), (batch_key("s1", 1), None)]


def test_a_change_is_written_batches_entry_then_deletions() -> None:
    """A crash keeps a prefix of a session's records (they are logged as made): the new
    batches come before the entry that refers to them, the deletions after the entry that
    no longer does (an entry left without its pending batches could never be closed)."""
    writes = RecordedWrites()
    store = TableBatches(cast(Any, object()), cast(Any, writes))
    store.delete("s1", 2)
    store.put("s1", 0, b"new")  # a slot deleted, then written anew in the same change
    store.put("s1", 2, b"more")
    store.commit("s1", b"entry")
    assert writes.log == [
        (batch_key("s1", 0), b"new"),
        (batch_key("s1", 2), b"more"),
        ("s1", b"entry"),
        (batch_key("s1", 1), None),
    ]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=6))
def test_latest_end_is_max(ends: list[float]) -> None:
    """The operation's ``acted_at``: what ``max(..., default=0.0)`` gives, NaNs included."""
    actions = [SimpleNamespace(timestamp_end=end) for end in ends]
    expected = max((a.timestamp_end for a in actions), default=0.0)
    assert repr(_latest_end(actions)) == repr(expected)
