"""The PII filter's CPU per action (issue #22: 15-30% of the pipeline worker's samples).

    python -m scripts.bench.pii [--sessions 300] [--repeat 5] [--tree /other/worktree]

Synthetic payloads (``agents.ingest.synthetic``), one ``PiiFilter.redact`` per payload as
the accumulator calls it; prints CPU µs per action (process time, best of ``--repeat``).
``--tree`` runs the same measurement on another checkout, alternating, for a before/after;
``--no-cache`` measures this tree without its per-session cache (text that never repeats);
``--ids`` gives every action a URL and a description with ids, as a real app's carry
(numeric ids of 4 to 9 digits, UUIDs): text that never repeats, with digits in it.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time

from agents.ingest.synthetic import interleaved_payloads, plan_sessions
from agents.pii import PiiFilter
from schemas import ActionsPayload
from scripts.bench.workload import with_ids

KEY = b"bench-key-not-a-secret-012345678"


def _with_ids(raw: dict, rng: random.Random) -> dict:
    return {**raw, "actions": [with_ids(a, rng) for a in raw["actions"]]}  # type: ignore[union-attr]


def measure(sessions: int, repeat: int, cache: bool = True, ids: bool = False) -> float:
    """Best CPU µs per action over ``repeat`` passes, each with a fresh filter."""
    rng = random.Random(3)
    raws = interleaved_payloads(plan_sessions(sessions, mean_length=40, seed=3), seed=3)
    payloads = [ActionsPayload.model_validate(_with_ids(r, rng) if ids else r) for r in raws]
    actions = sum(len(p.actions) for p in payloads)
    best = float("inf")
    for _ in range(repeat):
        pii = PiiFilter(key=KEY) if cache else PiiFilter(key=KEY, _cache=0)
        start = time.process_time()
        for p in payloads:
            pii.redact([p], p.session_id)
        best = min(best, time.process_time() - start)
    return best / actions * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-cache", action="store_true", help="this tree's uncached path")
    parser.add_argument("--ids", action="store_true", help="URLs and descriptions with ids")
    parser.add_argument("--tree", help="another checkout to compare with, alternating")
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --tree")
    args = parser.parse_args()
    if not args.tree:
        cpu = measure(args.sessions, args.repeat, cache=not args.no_cache, ids=args.ids)
        print(f"pii: {cpu:.1f} µs CPU per action")
        return
    trees = {"this": os.getcwd(), "other": os.path.abspath(args.tree)}
    # This file runs in each tree with that tree's packages (the other may predate it);
    # run_path, not `python file`: scripts/bench/codecs.py would shadow the stdlib's.
    code = f"import runpy; runpy.run_path({__file__!r}, run_name='__main__')"
    run = [sys.executable, "-c", code, f"--sessions={args.sessions}", f"--repeat={args.repeat}"]
    run += ["--ids"] * args.ids
    mine = run + ["--no-cache"] * args.no_cache
    for _ in range(args.rounds):
        for name, tree in trees.items():
            env = {**os.environ, "PYTHONPATH": tree}
            command = mine if name == "this" else run
            out = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
            print(f"{name:5} ({tree}): {out.stdout.strip() or out.stderr.strip()[-300:]}")


if __name__ == "__main__":
    main()
