"""Stdout sink: prints each operation, for trying things out and debugging."""

from __future__ import annotations

import sys

from schemas import ActionsWritten
from schemas.text import one_line
from sinks.base import Operation, Sink
from sinks.context import SessionContext

__all__ = ["StdoutSink"]


class StdoutSink(Sink):
    name = "stdout"
    inline = True
    reads_payload = False

    async def apply(self, op: Operation, context: SessionContext) -> None:
        if isinstance(op, ActionsWritten):
            line = f"[{one_line(op.session_id)}] actions {op.seq_from}-{op.seq_to}\n{op.text}\n"
        else:
            line = f"[{one_line(op.session_id)}] summary of 1-{op.seq_to}: {op.summary}\n"
        sys.stdout.write(line)
        sys.stdout.flush()
