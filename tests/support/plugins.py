"""Plug-ins that test workers load by dotted path from settings, as users would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

from agents.summarizer import default_format_actions
from schemas import ActionsPayload
from sinks.base import Operation
from sinks.context import SessionContext
from streams.settings import Settings


def format_with_session(payloads: list[ActionsPayload]) -> str:
    """A custom ``format_actions`` that names the session, so a fake LLM can tell sessions apart."""
    return f"Session {payloads[0].session_id}\n{default_format_actions(payloads)}"


def format_every_field(payloads: list[ActionsPayload]) -> str:
    """``format_with_session`` plus every text field (title, raw URL, the user's email), so
    a test sees in the prompt whatever the PII filter leaves of them."""
    lines = [f"Session {payloads[0].session_id} (user {payloads[0].email})"]
    lines += [
        f"- {a.type}: {a.title} | {a.description} | {a.raw_url}"
        for p in payloads
        for a in p.actions
    ]
    return "\n".join(lines)


def format_with_bug(payloads: list[ActionsPayload]) -> str:
    """``format_with_session`` with a bug: it raises for sessions whose id contains
    ``AC_BUG_MATCH`` while the file ``AC_BUG_FILE`` exists."""
    bug, match = os.environ.get("AC_BUG_FILE"), os.environ.get("AC_BUG_MATCH")
    if bug and match and match in payloads[0].session_id and Path(bug).exists():
        raise RuntimeError(f"formatter bug (simulated) for {payloads[0].session_id}")
    return format_with_session(payloads)


class RecordingSink:
    """Appends every operation it is given to a JSON-lines file, in application order."""

    name = "recorder"
    inline = True  # a local file: the runner's inline path (``Sink.inline``) is tested with it

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> RecordingSink:
        return cls(Path(os.environ["AC_RECORD_FILE"]))

    async def erase(self, session_id: str, context: SessionContext) -> None:
        with self.path.open("ab") as handle:
            handle.write(orjson.dumps({"op": "session_erased", "session_id": session_id}) + b"\n")

    async def apply(self, op: Operation, context: SessionContext) -> None:
        with self.path.open("ab") as handle:
            handle.write(orjson.dumps(op.model_dump(mode="json", exclude={"payload"})) + b"\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines of a file a worker appends to while the test reads it: a
    last line without its newline is still being written (a test read one half-written,
    test_llm_outage_loses_nothing_and_the_breaker_recovers; tests/unit/test_record_files.py)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [orjson.loads(line) for line in complete.splitlines() if line.strip()]
