"""Shares of a worker's CPU by area, from a py-spy raw profile (`--profile` writes them).

    python -m scripts.bench.profile_areas .bench/<run>/pipeline.pyspy.txt ...

py-spy sees Python frames only, so a C call (orjson, pydantic-core) is charged to the
line that made it: a sample whose innermost frame's source line calls orjson counts as
JSON, one that validates or dumps a model as pydantic. Then, by the innermost frame's
package: the Kafka clients (consumer or producer, by the stack), Faust, the event loop,
the metrics, our code (agents, streams, sinks, schemas), anything else by its package.
"""

from __future__ import annotations

import re
import sys
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


def areas(profile: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for row in profile.read_text().splitlines():
        frames, _, count = row.rpartition(" ")
        stack = []
        for frame in frames.split(";"):
            if found := FRAME.match(frame):
                stack.append((found["function"], found["file"], int(found["line"])))
        if stack:
            counts[area(stack)] += int(count)
    return counts


def main() -> None:
    if len(sys.argv) < 2:
        raise SystemExit("usage: python -m scripts.bench.profile_areas PROFILE.txt ...")
    for name in sys.argv[1:]:
        counts = areas(Path(name))
        total = sum(counts.values())
        print(f"{name}: {total:,} samples")
        for label, n in counts.most_common():
            print(f"  {label:<28} {n / total:6.1%}")


if __name__ == "__main__":
    main()
