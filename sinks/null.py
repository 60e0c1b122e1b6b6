"""Null sink: applies nothing. For benchmarks, and to run the pipeline without a destination."""

from __future__ import annotations

from sinks.base import Operation
from sinks.context import SessionContext
from streams.settings import Settings

__all__ = ["NullSink"]


class NullSink:
    name = "null"

    @classmethod
    def from_settings(cls, settings: Settings) -> NullSink:
        return cls()

    async def apply(self, op: Operation, context: SessionContext) -> None:
        return None
