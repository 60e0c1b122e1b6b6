"""The benchmark's Faust floor: a no-op Faust agent over the same `actions` topic.

It measures what Faust's per-message delivery alone costs on this machine (no
decoding, no state, no output), so the pipeline's figure can be read against
the framework it runs on. Run by scripts/bench.py as
``BENCH_FLOOR_MESSAGES=n faust -A scripts.bench_floor worker``; prints one
``FLOOR <messages/s>`` line when it has seen n messages, then exits.
"""

from __future__ import annotations

import os
import time
from typing import cast

import faust

from streams.app import create_app
from streams.settings import load_settings
from streams.topics import declare_topics

EXPECTED = int(os.environ["BENCH_FLOOR_MESSAGES"])

settings = load_settings()
app = create_app(settings, role="floor")
topics = declare_topics(app, settings)


@app.agent(topics.actions, name="floor")
async def floor(stream: faust.StreamT[bytes]) -> None:
    seen, start = 0, 0.0
    async for events in cast(faust.Stream[bytes], stream).noack_take(500, within=0.005):
        start = start or time.perf_counter()
        seen += len(events)
        for event in cast(list[faust.EventT], events):  # noack_take yields the events
            await stream.ack(event)
        if seen >= EXPECTED:
            print(f"FLOOR {seen / (time.perf_counter() - start):.0f}", flush=True)
            os._exit(0)  # done: no graceful shutdown needed for a measurement
