"""The root of the project's exceptions, in the lowest layer so every layer can use it."""

from __future__ import annotations

__all__ = ["AgentContextError"]


class AgentContextError(Exception):
    """Base of every exception this project raises on purpose: ``except AgentContextError``
    catches ours and nothing else (streams/errors.py holds the rest of the hierarchy)."""
