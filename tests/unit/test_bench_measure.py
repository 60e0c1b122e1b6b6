"""The bench's measuring: what the cores did between two readings, how often it polls a
worker, the changelog's bytes, a sink's work alone."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.bench.__main__ import parser
from scripts.bench.default import Ratios, summary
from scripts.bench.measure import (
    cpu_seconds,
    machine_shares,
    machine_ticks,
    poll_interval,
    runqueue_seconds,
    spy_command,
)
from scripts.bench.sink import operations
from scripts.bench.store_ops import apply_all
from scripts.bench.throughput import changelog_bytes
from scripts.bench.workload import workload
from streams.native import native


def test_the_shares_are_of_the_ticks_between_the_two_readings() -> None:
    assert machine_shares((100, 10, 1_000), (600, 60, 2_000)) == {
        "machine_busy": 0.5,
        "machine_steal": 0.05,
    }


def test_this_machines_ticks_add_up() -> None:
    busy, steal, total = machine_ticks()
    assert 0 < busy <= total and 0 <= steal <= total - busy
    later = machine_ticks()
    assert all(b >= a for a, b in zip((busy, steal, total), later, strict=True))


def test_processes_that_share_one_core_each_wait_for_it() -> None:
    """The window line's "waiting for one" (docs/performance.md): three spinners pinned to
    one core each spend 0.4 s of CPU, so each waits, runnable, about twice that while the
    other two run: more than it ran (which a reading of the run time would give)."""
    spin = (
        "import os, sys, time\n"
        f"os.sched_setaffinity(0, {{{min(os.sched_getaffinity(0))}}})\n"
        "end = time.process_time() + 0.4\n"
        "while time.process_time() < end: pass\n"
        "print(flush=True); sys.stdin.read()\n"  # done; alive until the reading is taken
    )
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", spin], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(3)
    ]
    waits, ran = [], []
    for spinner in spinners:
        assert spinner.stdout is not None and spinner.stdout.readline() == b"\n"
        waits.append(runqueue_seconds(spinner.pid))
        ran.append(cpu_seconds(spinner.pid))
    for spinner in spinners:
        spinner.communicate()
    assert all(w > 1.2 * r for w, r in zip(waits, ran, strict=True)), (waits, ran)


def test_a_worker_is_polled_often_only_near_the_end() -> None:
    # 1,000 done a second: 10 s to go is a 500 ms poll, 1 s to go 250 ms, 0.1 s to go 50 ms.
    assert poll_interval(done=5_000, elapsed_s=5, remaining=10_000) == 0.5
    assert poll_interval(done=5_000, elapsed_s=5, remaining=1_000) == 0.25
    assert poll_interval(done=5_000, elapsed_s=5, remaining=100) == 0.05
    assert poll_interval(done=0, elapsed_s=5, remaining=100) == 0.05  # no rate yet


def test_changelog_bytes_are_unknown_without_this_checkouts_broker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run against a broker this checkout did not start (another worktree's, compose's)
    printed 0 changelog bytes per action: now it says it cannot tell."""
    monkeypatch.setenv("KAFKA_DATA", str(tmp_path / "elsewhere"))
    assert math.isnan(changelog_bytes("127.0.0.1:9092", "app"))
    monkeypatch.setenv("KAFKA_DATA", str(tmp_path))
    segment = tmp_path / "logs" / "app-summaries-changelog-3" / "00000000000000000000.log"
    segment.parent.mkdir(parents=True)
    segment.write_bytes(b"x" * 700)
    (tmp_path / "logs" / "other-app-summaries-changelog-3").mkdir()
    assert changelog_bytes("127.0.0.1:9092", "app") == 700


def test_a_profile_pauses_the_worker_for_each_sample_at_the_rate_asked() -> None:
    """py-spy's --nonblocking read frames Python was reusing: stacks no code makes."""
    command = spy_command(42, Path("/runs/pipeline.pyspy.txt"), 1000)
    assert "--nonblocking" not in command and "--gil" in command
    assert command[command.index("-r") + 1] == "1000"
    assert command[-2:] == ["--pid", "42"]
    assert [parser().parse_args(a).profile for a in ([], ["--profile"], ["--profile", "1000"])] == [
        0,
        100,
        1000,
    ]


def test_repeated_runs_count_each_target_met_and_end_with_the_medians() -> None:
    """``python -m scripts.bench --repeat N``: one run proves little, so each target is
    counted over the runs, and the last line, for scripts, holds the medians."""
    runs = [
        Ratios(0.91, 1.53, 0.98, 0.73),
        Ratios(0.91, 1.30, 0.97, 0.78),
        Ratios(0.86, math.nan, 1.03, 0.49),  # (d) left out of one run
    ]
    lines = summary(runs)
    assert lines[:4] == [
        "c/b >= 1.0: met in 0 of 3 runs (0.91, 0.91, 0.86)",
        "c/d >= 1.5: met in 1 of 3 runs (1.53, 1.30, nan)",
        "cpu_pipeline/sdk <= 1.0: met in 2 of 3 runs (0.98, 0.97, 1.03)",
        "cpu_sink/sdk <= 0.5: met in 1 of 3 runs (0.73, 0.78, 0.49)",
    ]
    assert lines[-1] == "RATIOS c/b=0.91 c/d=1.42 cpu_pipeline/sdk=0.98 cpu_sink/sdk=0.73"
    assert summary(runs[:1])[-1] == runs[0].line()


def test_the_stores_fast_paths_store_what_the_models_path_stores() -> None:
    """scripts.bench.store_ops over the pipeline's operations: batches appended from their
    headers and summaries applied as Structs leave the table the models leave."""
    records, written, summaries = operations(workload(4000, 80, 5, min_batch=1, max_batch=3), 4)
    assert written and summaries
    values = [value for _, value in records]
    _, models = apply_all(values, mode="models")
    _, python = apply_all(values, mode="python")
    assert python == models
    if native is not None:
        _, compiled = apply_all(values, mode="compiled")
        assert compiled == models
