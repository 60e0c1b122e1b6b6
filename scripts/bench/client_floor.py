"""A no-op Faust agent over a topic, on Faust's own driver: ``aiokafka://`` or ``confluent://``.

Run by `python -m scripts.bench.clients` as ``faust -A scripts.bench.client_floor worker``
with ``BENCH_CLIENT_DRIVER``, ``BENCH_CLIENT_TOPIC``, ``BENCH_CLIENT_RECORDS`` (how many
to wait for), ``BENCH_CLIENT_APP`` (the app id: its own group), ``BENCH_CLIENT_DATA`` and the broker in
``KAFKA_BOOTSTRAP_SERVERS``. A plain ``faust.App``, none of our overrides: what each
driver costs as Faust ships it. Prints one ``CLIENTROW {json}`` line (as
``scripts.bench.client_rows``) when it has seen every record, then exits; the window
runs from the first record to the last (Faust's start-up and group join left out).
"""

from __future__ import annotations

import os
import time
from typing import cast

import faust
import orjson

from scripts.bench.client_rows import cpu_now

DRIVER = os.environ["BENCH_CLIENT_DRIVER"]
EXPECTED = int(os.environ["BENCH_CLIENT_RECORDS"])
BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092")


app = faust.App(
    os.environ["BENCH_CLIENT_APP"],
    broker=f"{DRIVER}://{BOOTSTRAP}",
    consumer_auto_offset_reset="earliest",
    producer_acks=-1,
    datadir=os.environ["BENCH_CLIENT_DATA"],  # the run's directory, not the working one
    topic_replication_factor=1,
    web_enabled=False,
)
topic = app.topic(
    os.environ["BENCH_CLIENT_TOPIC"], key_type=bytes, value_type=bytes, value_serializer="raw"
)


@app.agent(topic, name="floor")
async def floor(stream: faust.StreamT[bytes]) -> None:
    seen, start, cpu_start = 0, 0.0, 0.0
    async for events in cast(faust.Stream[bytes], stream).noack_take(500, within=0.005):
        if not start:
            start, cpu_start = time.perf_counter(), cpu_now()
        seen += len(events)
        for event in cast(list[faust.EventT], events):  # noack_take yields the events
            await stream.ack(event)
        if seen >= EXPECTED:
            wall, cpu = time.perf_counter() - start, cpu_now() - cpu_start
            row = {"records": seen, "wall_s": wall, "cpu_s": cpu}
            print("CLIENTROW " + orjson.dumps(row).decode(), flush=True)
            os._exit(0)  # done: no graceful shutdown needed for a measurement
