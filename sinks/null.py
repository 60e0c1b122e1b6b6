"""Null sink: delivers nothing. Agents read the pull view (``GET /sessions/{id}/context``),
which its worker keeps; for benchmarks, and to run the pipeline without a destination."""

from __future__ import annotations

from sinks.base import Operation, Sink
from sinks.context import SessionContext

__all__ = ["NullSink"]


class NullSink(Sink):
    name = "null"
    inline = True
    reads_payload = False
    delivers = False

    async def apply(self, op: Operation, context: SessionContext) -> None:
        return None
