"""Sinks for reliability tests, loaded by workers by dotted path (``AC_SINK=...``)."""

from __future__ import annotations

import os
from pathlib import Path

from sinks.base import Operation
from sinks.context import SessionContext
from streams.settings import Settings
from tests.support.plugins import RecordingSink

__all__ = ["FlakyRecordingSink"]


class FlakyRecordingSink(RecordingSink):
    """A recorder whose destination is down while the file ``AC_OUTAGE_FILE`` exists.

    During an outage every ``apply`` raises (as an HTTP client would on a
    refused connection) and nothing is recorded; the runner must retry, keep
    each session's order, and deliver everything once the destination is back.
    With ``AC_OUTAGE_MATCH`` set, only sessions whose id contains it are refused.
    """

    name = "flaky"
    inline = False  # a destination that fails per session: one task per session (lanes)

    def __init__(self, path: Path, outage_file: Path, match: str = "") -> None:
        super().__init__(path)
        self.outage_file = outage_file
        self.match = match

    @classmethod
    def from_settings(cls, settings: Settings) -> FlakyRecordingSink:
        return cls(
            Path(os.environ["AC_RECORD_FILE"]),
            Path(os.environ["AC_OUTAGE_FILE"]),
            os.environ.get("AC_OUTAGE_MATCH", ""),
        )

    async def apply(self, op: Operation, context: SessionContext) -> None:
        if self.match in op.session_id and self.outage_file.exists():
            raise ConnectionError(f"destination down (simulated): {op.op} {op.session_id}")
        await super().apply(op, context)
