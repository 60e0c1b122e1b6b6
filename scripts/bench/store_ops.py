"""A sink's own work per context operation, alone: the part of the null sink that is ours.

    python -m scripts.bench.store_ops [--tree OTHER] [--rounds 3] [--instructions]

Over the default workload's operations (``scripts.bench.sink.operations``), each operation is
decoded as a sink that delivers nothing decodes it and applied to a ``ContextStore`` over a
dict, as ``SinkStage.feed_inline`` applies them: runs of batches by ``append_run`` (compiled)
where it takes them, else ``load``, ``advanced`` and ``save``. No broker, no event loop. Prints CPU µs per operation.

``--tree`` runs the same in another checkout, alternating. ``--instructions`` counts the
instructions instead, with valgrind's callgrind, less a run over no operations: on a host
whose timings vary 20% from run to run, it still shows a 3% change (``--ops`` bounds the
operations; callgrind runs ~50x slower).
"""

from __future__ import annotations

import argparse
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast


def apply_all(
    values: list[bytes], *, mode: str = "compiled"
) -> tuple[float, dict[str, bytes | None]]:
    """CPU seconds to decode and apply ``values`` in order, a fresh store over a dict, and
    the dict. ``mode``: runs of batches stored by ``append_run``, ``compiled`` (``native/``)
    or ``python`` (its twin); ``models``: every operation as a model, by ``load``,
    ``advanced``, ``save``."""
    from sinks.context_store import ContextStore

    table: dict[str, bytes | None] = {}
    reader = SimpleNamespace(data=None, get=table.get)  # read as a table neither store knows
    app = cast(Any, SimpleNamespace(consumer_generation_id=1))
    if not hasattr(ContextStore, "append_run"):  # a checkout from before it
        store = ContextStore(app, cast(Any, reader))
        return _apply_each(store, table, values, fast=mode != "models")
    store = ContextStore(app, cast(Any, reader), compiled=mode == "compiled")
    return _apply_runs(store, table, values, appends=mode != "models")


def _apply_runs(
    store: Any, table: dict[str, bytes | None], values: list[bytes], *, appends: bool
) -> tuple[float, dict[str, bytes | None]]:
    """As ``SinkStage.feed_inline`` applies its fetched batches."""
    from schemas.fast import WrittenHeader, header_model
    from sinks.runner.messages import decode_operation
    from sinks.runner.stage import INLINE_BATCH_MAX

    start = time.process_time()
    for first in range(0, len(values), INLINE_BATCH_MAX):
        batch = values[first : first + INLINE_BATCH_MAX]
        at, end = 0, len(batch)
        while at < end:
            if appends:
                count, keys, records, _ = store.append_run(batch, at, 0.0)
                table.update(zip(keys, records, strict=True))
                at += count
                if at == end:
                    break
            op = decode_operation(batch[at], payload=False, header=appends)
            at += 1
            if type(op) is WrittenHeader:
                op = header_model(op)
            _apply(store, table, op)
    return time.process_time() - start, table


def _apply(store: Any, table: dict[str, bytes | None], op: Any) -> None:
    from sinks.context import Skip

    before = store.load(op.session_id)
    try:
        after = before.advanced(op)
    except Skip:
        return
    for _, key, value in store.save(before, after):
        table[key] = value


def _apply_each(
    store: Any, table: dict[str, bytes | None], values: list[bytes], *, fast: bool
) -> tuple[float, dict[str, bytes | None]]:
    """As ``feed_inline`` applied each operation before ``append_run`` (session 45)."""
    from schemas.fast import WrittenHeader, header_model
    from sinks.runner.messages import decode_operation

    start = time.process_time()
    for raw in values:
        op = decode_operation(raw, payload=False, header=fast)
        if type(op) is WrittenHeader:
            written = store.append(op.session_id, op.generation, op.seq_from, op.seq_to, op.text)
            if written is not None:
                table[written[1]] = written[2]
                continue
            op = header_model(op)
        _apply(store, table, op)
    return time.process_time() - start, table


def _child(ops: str, count: int) -> None:
    values = pickle.loads(Path(ops).read_bytes())[:count]
    seconds, _ = apply_all(values)
    print(f"{seconds * 1e6 / max(len(values), 1):.2f} µs CPU per operation ({len(values):,})")


def _instructions(command: list[str], tree: str, env: dict[str, str]) -> int:
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *command],
        cwd=tree, env=env, capture_output=True, text=True,
    )  # fmt: skip
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise SystemExit(f"callgrind gave no count: {out.stderr.strip()[-300:]}")
    return int(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", help="another checkout to compare with, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="alternations")
    parser.add_argument("--instructions", action="store_true", help="count with callgrind")
    parser.add_argument("--ops", type=int, default=0, help="the first N operations (0: all)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child, args.ops)
        return
    from scripts.bench.sink import operations
    from scripts.bench.workload import workload

    records, _, _ = operations(workload(200_000, 5_000, 7, min_batch=1, max_batch=3), 10)
    count = args.ops or len(records)
    trees = {"this": os.getcwd(), **({"other": os.path.abspath(args.tree)} if args.tree else {})}
    # This file runs in each tree with that tree's packages (the other may predate it).
    code = f"import runpy; runpy.run_path({__file__!r}, run_name='__main__')"
    with tempfile.NamedTemporaryFile(suffix=".ops") as ops:
        ops.write(pickle.dumps([value for _, value in records]))
        ops.flush()
        for _ in range(args.rounds):
            for name, tree in trees.items():
                env = {**os.environ, "PYTHONPATH": tree}
                run = [sys.executable, "-c", code, f"--child={ops.name}", f"--ops={count}"]
                if args.instructions:
                    work = _instructions(run, tree, env)
                    work -= _instructions([*run[:-1], "--ops=0"], tree, env)
                    shown = f"{work / count:,.0f} instructions per operation ({count:,})"
                else:
                    out = subprocess.run(run, cwd=tree, env=env, capture_output=True, text=True)
                    shown = out.stdout.strip() or out.stderr.strip()[-300:]
                print(f"{name:5} ({tree}): {shown}", flush=True)


if __name__ == "__main__":
    main()
