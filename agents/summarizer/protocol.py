"""What turns (previous summary, new actions) into the next rolling summary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from agents.summarizer.prompting import FormattedActions
from schemas import ActionsPayload

__all__ = ["Summarizer"]


class Summarizer(Protocol):
    """The summarize stage's view of a summarizer; subclass it to inherit ``aclose``."""

    name: str

    async def summarize(
        self,
        previous: str | None,
        payloads: Sequence[ActionsPayload],
        *,
        total: int | None = None,
        formatted: FormattedActions | None = None,
    ) -> str:
        """The next rolling summary; ``total`` is the session's action count after
        ``payloads`` (the request's ``seq_to``), for summarizers that state it.
        ``payloads``: models or their ``schemas.fast.Payload`` Structs (the same
        attributes); what hands them to user code converts them (``schemas.fast.payload_model``).
        ``formatted``: the default prompt's actions of ``payloads``, made already (or None)."""
        ...

    async def aclose(self) -> None:
        """Release what the summarizer holds (an HTTP client); called once, at shutdown.
        A no-op unless a summarizer holds something."""
        return None
