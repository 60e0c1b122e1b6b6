"""What turns (previous summary, new actions) into the next rolling summary.

``LLMSummarizer`` builds the prompt and calls any ``async (prompt) -> str``
through :class:`agents.resilience.ResilientLLM`; ``OfflineSummarizer`` needs no
network. ``build_summarizer`` picks one from settings and validates the prompt
and the plug-ins at start-up.
"""

from __future__ import annotations

import logging
from typing import Protocol

from agents.llm import (
    Completion,
    LLMCallable,
    LLMError,
    load_llm_callable,
    openai_llm,
    usage_of,
)
from agents.offline import offline_summary
from agents.pii import PiiFilter, build_pii_filter
from agents.prompting import (
    DEFAULT_PROMPT,
    ActionsFormatter,
    build_prompt,
    cap_summary,
    default_format_actions,
    validate_template,
)
from agents.resilience import ResilientLLM
from schemas import ActionsPayload
from streams.plugins import resolve
from streams.settings import ConfigurationError, Settings

__all__ = ["LLMSummarizer", "OfflineSummarizer", "Summarizer", "build_summarizer"]

log = logging.getLogger(__name__)


class Summarizer(Protocol):
    name: str

    async def summarize(
        self, previous: str | None, payloads: list[ActionsPayload], *, total: int | None = None
    ) -> str:
        """The next rolling summary; ``total`` is the session's action count after
        ``payloads`` (the request's ``seq_to``), for summarizers that state it."""
        ...


class OfflineSummarizer:
    name = "offline"

    def __init__(self, max_chars: int) -> None:
        self._max_chars = max_chars

    async def summarize(
        self, previous: str | None, payloads: list[ActionsPayload], *, total: int | None = None
    ) -> str:
        return cap_summary(offline_summary(previous, payloads, total=total), self._max_chars)


def _non_empty(llm: LLMCallable) -> LLMCallable:
    async def call(prompt: str) -> str:
        answer = await llm(prompt)
        if not isinstance(answer, str) or not answer.strip():
            raise LLMError("the LLM returned an empty answer", retryable=True, kind="empty")
        return answer

    return call


class LLMSummarizer:
    name = "llm"

    def __init__(
        self,
        llm: ResilientLLM,
        *,
        template: str,
        formatter: ActionsFormatter,
        max_chars: int,
        pii: PiiFilter | None = None,
    ) -> None:
        self.llm = llm
        self._pii = pii
        self._template = template
        self._formatter = formatter
        self._max_chars = max_chars

    async def summarize(
        self, previous: str | None, payloads: list[ActionsPayload], *, total: int | None = None
    ) -> str:
        if self._pii is not None and payloads:
            # Before formatting, so a custom formatter sees placeholders too; the previous
            # summary as well: an offline fold (agents/summarize/) is made from raw actions.
            session = payloads[0].session_id
            payloads = self._pii.redact(payloads, session)
            previous = self._pii.redact_text(previous, session) if previous else previous
        prompt = build_prompt(self._template, previous, payloads, self._formatter)
        answer = await self.llm(prompt)
        return Completion(cap_summary(answer, self._max_chars), usage_of(answer))


def _formatter(settings: Settings) -> ActionsFormatter:
    if not settings.format_actions:
        return default_format_actions
    formatter = resolve(settings.format_actions, "AC_FORMAT_ACTIONS")
    if not callable(formatter):
        raise ConfigurationError(f"AC_FORMAT_ACTIONS {settings.format_actions!r} is not callable")
    return formatter  # type: ignore[no-any-return]


def _template(settings: Settings) -> str:
    template = settings.prompt_template() or DEFAULT_PROMPT
    try:
        validate_template(template)
    except ValueError as exc:
        raise ConfigurationError(f"AC_PROMPT: {exc}") from None
    return template


def build_summarizer(settings: Settings) -> Summarizer:
    """Custom callable > OpenAI-compatible API (when a key is set) > offline."""
    template = _template(settings)  # validated even when unused: fail early, always
    formatter = _formatter(settings)
    pii = build_pii_filter(settings)  # also checked at start when unused
    if settings.llm_callable:
        try:
            llm = load_llm_callable(settings.llm_callable)
        except ValueError as exc:
            raise ConfigurationError(f"AC_LLM_CALLABLE: {exc}") from None
        source = settings.llm_callable
    elif settings.llm_api_key is not None:
        llm = openai_llm(settings)
        source = f"OpenAI-compatible API, model {settings.llm_model}"
    else:
        log.info("no LLM configured (AC_LLM_API_KEY / AC_LLM_CALLABLE): offline summarizer")
        return OfflineSummarizer(settings.summary_max_chars)
    log.info("summarizer: %s", source)
    return LLMSummarizer(
        ResilientLLM.from_settings(_non_empty(llm), settings),
        template=template,
        formatter=formatter,
        max_chars=settings.summary_max_chars,
        pii=pii,
    )
