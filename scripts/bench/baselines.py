"""What the pipeline is compared with: (a) raw aiokafka, (a'/a'') the no-op floors, (b) the SDK."""

from __future__ import annotations

import os
import re
import subprocess
import time
from typing import cast

import orjson
from aiokafka import AIOKafkaConsumer

from scripts.bench.measure import ROOT
from streams.app import worker_command
from streams.settings import Settings


async def bench_raw_consumer(
    bootstrap: str, topic: str, expected_messages: int, actions: int
) -> float:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    try:
        seen, start = 0, time.perf_counter()
        while seen < expected_messages:
            batches = await consumer.getmany(timeout_ms=1000, max_records=10_000)
            seen += sum(len(records) for records in batches.values())
        return actions / (time.perf_counter() - start)
    finally:
        await consumer.stop()


def bench_faust_floor(
    env: dict[str, str], messages: int, actions: int, port: int, mode: str
) -> float:
    """A consumer doing nothing with the same topic (scripts/bench/floor.py):
    ``agent``, Faust's per-message delivery (a'); ``batch``, our BatchSource (a'')."""
    proc = subprocess.run(
        worker_command("scripts.bench.floor", port),
        cwd=ROOT,
        env={
            **os.environ,
            **env,
            "BENCH_FLOOR_MESSAGES": str(messages),
            "BENCH_FLOOR_MODE": mode,
        },
        capture_output=True,
        timeout=900,
        check=False,
    )
    found = re.search(rb"FLOOR (\d+)", proc.stdout + proc.stderr)
    if not found:
        raise SystemExit(f"the Faust floor run failed:\n{proc.stderr.decode()[-2000:]}")
    return int(found.group(1)) * actions / messages


async def bench_sdk(
    payload_bytes: list[bytes], actions: int, threshold: int
) -> tuple[float, float]:
    """(b): actions/s and CPU µs per action (this process's CPU time over the same span)."""
    from autoplay_sdk import AsyncSessionSummarizer
    from autoplay_sdk.context.agent_context import AsyncAgentContextWriter
    from autoplay_sdk.core.models import ActionsPayload as SdkPayload

    async def llm(prompt: str) -> str:
        return "summary"

    async def noop(session_id: str, text: str) -> None:
        return None

    summarizer = AsyncSessionSummarizer(llm=llm, threshold=threshold)
    writer = AsyncAgentContextWriter(
        summarizer=summarizer, write_actions=noop, overwrite_with_summary=noop
    )
    start, cpu_start = time.perf_counter(), time.process_time()
    for raw in payload_bytes:  # what a consumer of the SSE stream does per event
        await writer.add(SdkPayload.from_dict(orjson.loads(raw)))
    await summarizer.flush()
    cpu = time.process_time() - cpu_start
    return actions / (time.perf_counter() - start), cpu * 1e6 / actions


def bench_transition(
    payload_bytes: list[bytes], actions: int, threshold: int, *, compiled: bool
) -> float:
    """Our accumulator's own work per payload, in this process: no Kafka, no summarizer.

    What (c) does beside the SDK's work, minus the plumbing: decode and validate the
    payload, load the session's entry, apply it (the stored batch, the operation, the
    summarize request at K), encode the entry again. ``compiled``: as the stage does it
    with the compiled transition (``agents/accumulate/compiled.py``), else in Python.
    """
    from agents.accumulate.compiled import apply_compiled
    from agents.accumulate.state import Limits, MemoryBatchStore, SessionState, apply_payload
    from schemas.fast import decode_payload

    limits = Limits(threshold=threshold, max_actions_per_batch=Settings().max_actions_per_batch)
    store, entries = MemoryBatchStore(), dict[str, bytes]()
    start = time.perf_counter()
    for offset, raw in enumerate(payload_bytes):
        if compiled and (
            done := apply_compiled(raw, entries.get, offset, limits, time.time(), store, None)
        ):
            entries[done.session_id] = cast(bytes, done.entry)
            continue
        payload = decode_payload(raw)
        entry = entries.get(payload.session_id)
        state = None if entry is None else SessionState.from_bytes(entry)
        state, _ = apply_payload(state, payload, offset, limits, store=store)
        entries[payload.session_id] = state.to_bytes()
    return actions / (time.perf_counter() - start)
