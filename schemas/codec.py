"""Fast JSON encoding of the wire models (orjson + pydantic-core)."""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from schemas.errors import AgentContextError

__all__ = ["InvalidMessage", "decode", "describe", "encode"]

M = TypeVar("M", bound=BaseModel)


class InvalidMessage(AgentContextError, ValueError):
    """A message that cannot become the model it should be; ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(model: BaseModel) -> bytes:
    return orjson.dumps(model.model_dump(mode="json"))


def describe(error: ValidationError) -> str:
    parts = []
    for item in error.errors(include_url=False, include_input=False)[:5]:
        where = ".".join(str(p) for p in item["loc"]) or "payload"
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)


def decode(model: type[M], raw: bytes | str | None) -> M:
    """Parse and validate ``raw``; raise :class:`InvalidMessage` with a readable reason."""
    if raw is None:
        raise InvalidMessage("empty message (no value)")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise InvalidMessage(f"invalid {model.__name__}: {describe(exc)}") from None
