"""The benchmark's floors: a consumer that does nothing with the `actions` topic.

``BENCH_FLOOR_MODE=agent``: a no-op Faust agent (Faust's per-message delivery
alone, the floor under any Faust agent). ``BENCH_FLOOR_MODE=batch``: a no-op
``streams._faust.batch_source.BatchSource`` (the delivery our workers use: Faust's
consumer, group and commits, records taken in batches as they are fetched).
No decoding, no state, no output. Run by `python -m scripts.bench` as
``BENCH_FLOOR_MESSAGES=n faust -A scripts.bench.floor worker``; prints one
``FLOOR <messages/s>`` line when it has seen n messages, then exits.
"""

from __future__ import annotations

import os
import time
from typing import cast

import faust

from streams._faust.batch_source import BatchSource
from streams.app import create_app
from streams.settings import load_settings
from streams.topics import declare_topics

EXPECTED = int(os.environ["BENCH_FLOOR_MESSAGES"])
MODE = os.environ.get("BENCH_FLOOR_MODE", "agent")

settings = load_settings()
app = create_app(settings, role=f"floor-{MODE}")
topics = declare_topics(app, settings)


def report(seen: int, start: float) -> None:
    if seen >= EXPECTED:
        print(f"FLOOR {seen / (time.perf_counter() - start):.0f}", flush=True)
        os._exit(0)  # done: no graceful shutdown needed for a measurement


if MODE == "batch":
    source = BatchSource(app, topics.actions)

    @app.task
    async def floor_batch() -> None:
        seen, start = 0, 0.0
        async for batch in source.batches():
            start = start or time.perf_counter()
            seen += len(batch)
            for message in batch:
                await source.ack(message)
            report(seen, start)

else:

    @app.agent(topics.actions, name="floor")
    async def floor(stream: faust.StreamT[bytes]) -> None:
        seen, start = 0, 0.0
        async for events in cast(faust.Stream[bytes], stream).noack_take(500, within=0.005):
            start = start or time.perf_counter()
            seen += len(events)
            for event in cast(list[faust.EventT], events):  # noack_take yields the events
                await stream.ack(event)
            report(seen, start)
