"""The vector sink against raw LanceDB on this machine, for the same vectors.

    python scripts/bench_vector.py [--summaries 100000] [--queries 1000]

Upserts/s through ``VectorSink.apply`` (ids, bookkeeping, the write rounds of
``LanceStore``; sessions applied concurrently, as lanes do), then LanceDB's own
``merge_insert`` in batches for the same rows; query p50/p99 through
``search_sessions`` (product filter, best hit per session) and through a raw
``table.search`` with the same filter. Embeddings (WordLlama) are computed once
up front and served from memory on both sides, so only the store is compared;
their own rate is printed too. Ratios are ours / raw from this one run.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lancedb

from schemas import SummaryReady
from sinks.context import SessionContext
from sinks.vector import LanceStore, VectorSink, load_wordllama, search_sessions

WORDS = (
    "dashboard billing invoice export csv report teammate invite integration salesforce "
    "oauth error upgrade plan seat checkout webhook secret api key settings profile search "
    "filter chart revenue quarterly onboarding tutorial support ticket calendar sync slack"
).split()
PRODUCTS = [f"prod_{i}" for i in range(10)]


class Precomputed:
    """An embedder answering from a dict: the store is what is measured."""

    def __init__(self, vectors: dict[str, list[float]]) -> None:
        self.vectors = vectors

    async def __call__(self, texts: list[str]) -> list[list[float]]:
        return [self.vectors[t] for t in texts]


def texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [f"{i} actions so far. " + " ".join(rng.choices(WORDS, k=24)) for i in range(n)]


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if q < 100 else 0.0


async def through_the_sink(
    directory: Path, summaries: list[str], vectors: dict[str, list[float]], concurrency: int
) -> tuple[VectorSink, float]:
    sink = VectorSink(LanceStore(directory), Precomputed(vectors))
    await sink.setup()
    todo = iter(enumerate(summaries))

    async def lane() -> None:
        for i, text in todo:
            op = SummaryReady(session_id=f"s{i}", product_id=PRODUCTS[i % 10], seq_from=1,
                              seq_to=10, window_from=1, summary=text, emitted_at=0.0)  # fmt: skip
            await sink.apply(op, SessionContext(session_id=op.session_id))

    started = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return sink, len(summaries) / (time.perf_counter() - started)


def raw_lancedb(directory: Path, rows: list[dict[str, Any]], batch: int) -> tuple[Any, float]:
    table = lancedb.connect(str(directory)).create_table("raw", data=rows[:batch])
    started = time.perf_counter()
    for start in range(batch, len(rows), batch):
        chunk = rows[start : start + batch]
        table.merge_insert("id").when_matched_update_all().when_not_matched_insert_all().execute(
            chunk
        )
    return table, (len(rows) - batch) / (time.perf_counter() - started)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summaries", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=1_000)
    parser.add_argument("--concurrency", type=int, default=256, help="sessions in flight")
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    n = args.summaries
    summaries, questions = texts(n, 1), [" ".join(t.split()[4:12]) for t in texts(args.queries, 2)]

    model = load_wordllama()
    started = time.perf_counter()
    matrix = model.embed(summaries + questions, norm=True, batch_size=2048)
    embed_rate = len(matrix) / (time.perf_counter() - started)
    vectors = {t: v.tolist() for t, v in zip(summaries + questions, matrix, strict=True)}

    with tempfile.TemporaryDirectory(prefix="bench-vector-") as tmp:
        sink, ours_rate = await through_the_sink(Path(tmp) / "ours", summaries, vectors,
                                                 args.concurrency)  # fmt: skip
        rows = [
            {**LanceStore._row(sink._record(  # the same columns as the sink's
                SummaryReady(session_id=f"s{i}", product_id=PRODUCTS[i % 10], seq_from=1,
                             seq_to=10, window_from=1, summary=t, emitted_at=0.0),
                {"product_id": PRODUCTS[i % 10]}, "summary", t, 1)), "vector": vectors[t]}
            for i, t in enumerate(summaries)
        ]  # fmt: skip
        table, raw_rate = raw_lancedb(Path(tmp) / "raw", rows, batch=args.concurrency)
        raw_bulk_started = time.perf_counter()
        lancedb.connect(str(Path(tmp) / "bulk")).create_table("bulk", data=rows)
        bulk_rate = n / (time.perf_counter() - raw_bulk_started)

        ours_ms, raw_ms = [], []
        for i, question in enumerate(questions):
            product = PRODUCTS[i % 10]
            started = time.perf_counter()
            await search_sessions(sink, question, k=args.k, product_id=product)
            ours_ms.append((time.perf_counter() - started) * 1000)
            started = time.perf_counter()
            table.search(vectors[question]).metric("cosine").where(
                f"product_id = '{product}'", prefilter=True
            ).limit(args.k).to_list()
            raw_ms.append((time.perf_counter() - started) * 1000)
        stored = await sink.store.count()  # type: ignore[attr-defined]
        await sink.aclose()

    p50, p99 = percentile(ours_ms, 50), percentile(ours_ms, 99)
    r50, r99 = percentile(raw_ms, 50), percentile(raw_ms, 99)
    print(f"summaries stored: {stored:,} (256-dim WordLlama; embedding: {embed_rate:,.0f} texts/s)")
    print(f"upserts/s   vector sink {ours_rate:9,.0f}   raw merge_insert x{args.concurrency}"
          f" {raw_rate:9,.0f}   ratio {ours_rate / raw_rate:.2f}"
          f"   (raw bulk create {bulk_rate:,.0f}/s)")  # fmt: skip
    print(
        f"query p50   vector sink {p50:7.2f} ms   raw search {r50:7.2f} ms   ratio {p50 / r50:.2f}"
    )
    print(
        f"query p99   vector sink {p99:7.2f} ms   raw search {r99:7.2f} ms   ratio {p99 / r99:.2f}"
    )


if __name__ == "__main__":
    asyncio.run(main())
