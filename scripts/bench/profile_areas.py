"""Shares of a worker's CPU by area, from a py-spy raw profile (`--profile` writes them).

    python -m scripts.bench.profile_areas .bench/<run>/pipeline.pyspy.txt ...
    python -m scripts.bench.profile_areas PROFILE.txt --functions 30   # inclusive and self
    python -m scripts.bench.profile_areas PROFILE.txt --under SummarizeStage.handle

py-spy sees Python frames only, so a C call (orjson, pydantic-core) is charged to the
line that made it: a sample whose innermost frame's source line calls orjson counts as
JSON, one that validates or dumps a model as pydantic. Then, by the innermost frame's
package: the Kafka clients (consumer or producer, by the stack), Faust, the event loop,
the metrics, our code (agents, streams, sinks, schemas), anything else by its package.
"""

from __future__ import annotations

import argparse
import re
import sysconfig
from collections import Counter
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(sysconfig.get_paths()["purelib"])
FRAME = re.compile(r"(?P<function>.*) \((?P<file>[^:()]+):(?P<line>\d+)\)$")
OURS = ("agents/", "streams/", "sinks/", "schemas/", "scripts/")
PRODUCING = ("aiokafka/producer/", "streams/_faust/appender.py", "streams/_faust/changelog.py")


@cache
def source_line(file: str, line: int) -> str:
    for base in (ROOT, SITE):
        path = base / file
        if path.is_file():
            lines = path.read_text(errors="replace").splitlines()
            return lines[line - 1] if 0 < line <= len(lines) else ""
    return ""


def area(stack: list[tuple[str, str, int]]) -> str:
    """The area of one sample's stack (outermost frame first)."""
    _, file, line = stack[-1]
    text = source_line(file, line)
    if "orjson" in text or ("json" in text.lower() and ("loads" in text or "dumps" in text)):
        return "JSON (orjson)"
    if file.startswith(("pydantic", "pydantic_core")) or re.search(
        r"validate|model_dump|model_copy|model_construct|TypeAdapter", text
    ):
        return "pydantic"
    if file.startswith(("aiokafka/", "kafka/")):
        files = [f for _, f, _ in stack]
        producing = any(f.startswith(PRODUCING) for f in files)
        return "Kafka client: producer" if producing else "Kafka client: consumer"
    if file.startswith(("faust/", "mode/")):
        return "Faust / mode"
    if file.startswith(("asyncio/", "selectors", "uvloop/")) or file == "<frozen runpy>":
        return "event loop"
    if file.startswith("prometheus_client/"):
        return "metrics"
    if file.startswith(OURS):
        return "our code: " + file.split("/", 1)[0]
    return "other: " + file.split("/", 1)[0]


Stack = list[tuple[str, str, int]]  # (function, file, line), outermost first


def samples(profile: Path) -> list[tuple[Stack, int]]:
    """Each row of a raw profile: its stack and how many samples it holds."""
    rows = []
    for row in profile.read_text().splitlines():
        frames, _, count = row.rpartition(" ")
        stack = []
        for frame in frames.split(";"):
            if found := FRAME.match(frame):
                stack.append((found["function"], found["file"], int(found["line"])))
        if stack:
            rows.append((stack, int(count)))
    return rows


def areas(rows: list[tuple[Stack, int]]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for stack, count in rows:
        counts[area(stack)] += count
    return counts


def functions(rows: list[tuple[Stack, int]]) -> tuple[Counter[str], Counter[str]]:
    """Samples per function ("name (file)"): on the stack (inclusive, once per sample) and
    innermost (self)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for stack, count in rows:
        names = [f"{function} ({file})" for function, file, _ in stack]
        for name in set(names):
            inclusive[name] += count
        own[names[-1]] += count
    return inclusive, own


def callees(rows: list[tuple[Stack, int]], name: str) -> Counter[str]:
    """Samples under the outermost frame of function ``name``, by the function it called
    next ("(itself)": in its own lines)."""
    under: Counter[str] = Counter()
    for stack, count in rows:
        names = [function for function, _, _ in stack]
        if name in names:
            i = names.index(name)
            under[names[i + 1] if i + 1 < len(names) else "(itself)"] += count
    return under


def main() -> None:
    parse = argparse.ArgumentParser(prog="python -m scripts.bench.profile_areas")
    parse.add_argument("profiles", nargs="+", type=Path)
    parse.add_argument("--functions", type=int, metavar="N", help="the N busiest functions")
    parse.add_argument("--under", metavar="FUNCTION", help="what FUNCTION's samples called")
    args = parse.parse_args()
    for name in args.profiles:
        rows = samples(name)
        total = sum(count for _, count in rows)
        print(f"{name}: {total:,} samples")
        if args.under:
            for callee, n in callees(rows, args.under).most_common():
                print(f"  {n / total:6.1%}  {callee}")
        elif args.functions:
            inclusive, own = functions(rows)
            for label, counts in (("on the stack", inclusive), ("innermost", own)):
                print(f" {label}:")
                for function, n in counts.most_common(args.functions):
                    print(f"  {n / total:6.1%}  {function}")
        else:
            for label, n in areas(rows).most_common():
                print(f"  {label:<28} {n / total:6.1%}")


if __name__ == "__main__":
    main()
