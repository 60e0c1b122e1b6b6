"""The built-in offline summarizer: deterministic and extractive, no network.

Serves when no LLM is configured (the demo, air-gapped installs). It keeps what
a support agent needs most: the pages visited, the notable actions, and the
last step, and it rolls the previous summary forward in a bounded form.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agents.summarizer.prompting import FormattedActions, cap_summary
from agents.summarizer.protocol import Summarizer
from schemas import ActionsPayload, SlimAction
from schemas.text import holds_any

__all__ = ["OfflineSummarizer", "offline_summary"]

_KEY_TYPES = ("submit", "error", "purchase", "upgrade", "delete", "export", "invite", "create")
_PREVIOUS_PAGES = re.compile(r"Pages: (.*?)\.(?: |$)")
_PREVIOUS_COUNT = re.compile(r"^(\d+) actions? so far")


def _is_key(action: SlimAction) -> bool:
    text = f"{action.type} {action.title} {action.description}".lower()
    return holds_any(_KEY_TYPES, text)


def _page(action: SlimAction) -> str:
    return action.canonical_url or action.raw_url or "(unknown page)"


def _previous(previous: str | None) -> tuple[int, list[str]]:
    if not previous:
        return 0, []
    count = _PREVIOUS_COUNT.search(previous)
    pages = _PREVIOUS_PAGES.search(previous)
    return (
        int(count.group(1)) if count else 0,
        pages.group(1).split(", ") if pages else [],
    )


def offline_summary(
    previous: str | None, payloads: Sequence[ActionsPayload], *, total: int | None = None
) -> str:
    """``total``: the session's action count so far when the caller knows it (the
    summarize stage does: the request's ``seq_to``); else it is read from ``previous``."""
    actions = [a for p in payloads for a in p.actions]
    before, pages = _previous(previous)
    count = before + len(actions) if total is None else total
    for action in actions:
        page = _page(action)
        if page in pages:
            pages.remove(page)
        pages.append(page)  # most recent last
    pages = pages[-6:]
    key = list(dict.fromkeys(a.description or a.title for a in actions if _is_key(a)))[-3:]
    last = actions[-1] if actions else None
    noun = "action" if count == 1 else "actions"
    parts = [f"{count} {noun} so far.", f"Pages: {', '.join(pages)}."]
    if key:
        parts.append(f"Key actions: {'; '.join(key)}.")
    if last is not None:
        parts.append(f"Last step: {last.description or last.title} ({last.type or 'action'}).")
    return " ".join(parts)


class OfflineSummarizer(Summarizer):
    name = "offline"

    def __init__(self, max_chars: int) -> None:
        self._max_chars = max_chars

    async def summarize(
        self,
        previous: str | None,
        payloads: Sequence[ActionsPayload],
        *,
        total: int | None = None,
        formatted: FormattedActions | None = None,  # not a prompt's: not read
    ) -> str:
        return cap_summary(offline_summary(previous, payloads, total=total), self._max_chars)
