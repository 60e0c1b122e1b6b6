"""Reading a py-spy raw profile: areas, the busiest functions, what a function called."""

from __future__ import annotations

from pathlib import Path

from scripts.bench.profile_areas import areas, callees, functions, samples

RUN, HANDLE = "run (faust/x.py:1)", "handle (agents/summarize/stage.py:{})"
PROFILE = "\n".join(
    [
        f"{RUN};{HANDLE.format(10)};count_batches (schemas/ledger.py:5) 6",
        f"{RUN};{HANDLE.format(11)} 2",
        f"{RUN};{HANDLE.format(12)};helper (agents/a.py:3);{HANDLE.format(10)} 1",
        f"{RUN} 1",
    ]
)


def test_a_profile_reads_as_areas_functions_and_callees(tmp_path: Path) -> None:
    path = tmp_path / "pipeline.pyspy.txt"
    path.write_text(PROFILE)
    rows = samples(path)
    assert sum(count for _, count in rows) == 10
    assert areas(rows) == {"our code: schemas": 6, "our code: agents": 3, "Faust / mode": 1}
    inclusive, own = functions(rows)
    # A function on a stack twice (a recursion) counts once for that sample.
    assert inclusive["handle (agents/summarize/stage.py)"] == 9
    assert own["count_batches (schemas/ledger.py)"] == 6 and own["run (faust/x.py)"] == 1
    assert callees(rows, "handle") == {"count_batches": 6, "(itself)": 2, "helper": 1}
    assert callees(rows, "absent") == {}
