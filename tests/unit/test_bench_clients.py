"""scripts.bench.clients: the CLIENTS line, the rows' pure helpers, and the pacing."""

from __future__ import annotations

import time

from scripts.bench.client_rows import _last_per_partition
from scripts.bench.clients import clients_line
from scripts.bench.workload import paced


def test_the_clients_line_is_the_median_of_each_repeats_pair() -> None:
    line = clients_line(
        {
            "consume-aiokafka": [4.0, 4.0, 8.0],
            "consume-rdkafka-loop": [2.0, 3.0, 2.0],  # pairs: 0.5, 0.75, 0.25
            "produce-aiokafka": [4.0],
            "produce-rdkafka-grouped": [5.0],
        }
    )
    assert line == "CLIENTS consume_rdkafka/aiokafka=0.50 produce_rdkafka/aiokafka=1.25"


def test_a_missing_row_gives_nan_not_a_crash() -> None:
    line = clients_line({"consume-aiokafka": [4.0]})
    assert line == "CLIENTS consume_rdkafka/aiokafka=nan produce_rdkafka/aiokafka=nan"


def test_each_partitions_last_record_reports_for_all_its_records() -> None:
    reports = _last_per_partition([0, 1, 0, 2, 1, 0], lambda n: f"covers {n}")  # type: ignore[arg-type,return-value]
    assert reports == [None, None, None, "covers 1", "covers 2", "covers 3"]


async def test_paced_ticks_cover_every_index_once_in_order() -> None:
    """The load generator's and the produce rows' pacing hands out each index once, in
    order, and none before its due time (start + index / rate)."""
    start = time.perf_counter()
    seen: list[int] = []
    async for due in paced(50, rate=5_000, tick_s=0.002):
        assert time.perf_counter() - start >= due.start / 5_000
        seen.extend(due)
    assert seen == list(range(50))
