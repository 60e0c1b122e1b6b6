"""Dead letters: input that could not be applied, kept with the reason."""

from __future__ import annotations

import base64

from pydantic import BaseModel

__all__ = ["DeadLetter"]


class DeadLetter(BaseModel):
    """Anything that could not be parsed, validated or processed. Never dropped."""

    reason: str
    stage: str  # which agent gave up: accumulate, summarize, ...
    source_topic: str
    partition: int
    offset: int
    key: str | None = None
    original_b64: str  # the original bytes, exactly as consumed
    failed_at: float

    @staticmethod
    def encode_original(raw: bytes | None) -> str:
        return base64.b64encode(raw or b"").decode("ascii")

    @property
    def original(self) -> bytes:
        return base64.b64decode(self.original_b64)
