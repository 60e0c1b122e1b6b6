"""The LLM summarizer, and the choice of summarizer from settings.

``LLMSummarizer`` builds the prompt and calls any ``async (prompt) -> str``
through :class:`agents.summarizer.resilience.ResilientLLM`; ``build_summarizer``
picks it or the offline one from settings and validates the prompt and the
plug-ins at start-up.
"""

from __future__ import annotations

import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence

from agents.pii import FIELD_POLICY, PiiFilter, build_pii_filter
from agents.summarizer.llm import Completion, load_llm_callable, openai_llm, usage_of
from agents.summarizer.offline import OfflineSummarizer
from agents.summarizer.prompting import (
    DEFAULT_PROMPT,
    ActionsFormatter,
    FormattedActions,
    build_prompt,
    cap_summary,
    default_format_actions,
    validate_template,
)
from agents.summarizer.protocol import Summarizer
from agents.summarizer.resilience import ResilientLLM
from schemas import ActionsPayload
from schemas.actions import ACTION_TEXT_FIELDS
from schemas.fast import payload_model
from streams.hooks import load_callable
from streams.settings import ConfigurationError, Settings

__all__ = ["LLMSummarizer", "build_summarizer"]

log = logging.getLogger(__name__)


class LLMSummarizer(Summarizer):
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
        # Per session, a digest of the last summary this process's model wrote from filtered
        # input: its words are the model's, so the PII pass skips it as the next `previous`.
        self._written: OrderedDict[str, bytes] = OrderedDict()

    def _wrote(self, session: str, text: str) -> bool:
        return self._written.get(session) == _digest(text)

    def _remember(self, session: str, text: str) -> None:
        written = self._written
        written.pop(session, None)
        written[session] = _digest(text)
        if len(written) > _WRITTEN_MAX:
            written.popitem(last=False)

    async def summarize(
        self,
        previous: str | None,
        payloads: Sequence[ActionsPayload],
        *,
        total: int | None = None,
        formatted: FormattedActions | None = None,
    ) -> str:
        pii, default = self._pii, self._formatter is default_format_actions
        if formatted is not None:  # the payloads may be decoded when first read: not here
            session: str | None = formatted.session
        else:
            session = payloads[0].session_id if payloads else None
        # The default prompt's actions made already (agents.summarize.compiled), or None.
        actions = formatted.text if default and formatted is not None else None
        if pii is not None and session is not None:
            # Before formatting, so a custom formatter sees placeholders too. The previous
            # summary as well, unless this model wrote it from filtered input: an offline
            # fold (agents/summarize/) is made from raw actions, and a summary from before a
            # restart is not known. 0.6-0.7 ms a 1,500-char summary (the secret, card, IP patterns)
            # (test_summarize.py::test_the_pii_pass_skips_only_summaries_its_model_wrote).
            # The default formatter reads a few fields: the others (a raw URL with its ids,
            # the dearest to filter) never reach the model, so they are not filtered.
            # Actions made already stand where the pass leaves every text they hold.
            if formatted is None or actions is None or not _clean(pii, formatted, session):
                actions = None
                fields = ACTION_TEXT_FIELDS if default else None
                payloads = pii.redact(list(payloads), session, fields)
            if previous and not self._wrote(session, previous):
                previous = pii.redact_text(previous, session)
        if actions is not None:
            prompt = build_prompt(self._template, previous, [], formatted=actions)
        else:  # the default formatter reads the Structs, a user's gets the models
            models = list(payloads) if default else [payload_model(p) for p in payloads]
            prompt = build_prompt(self._template, previous, models, self._formatter)
        answer = await self.llm(prompt)
        summary = Completion(cap_summary(answer, self._max_chars), usage_of(answer))
        if pii is not None and session is not None:
            self._remember(session, summary)
        return summary

    async def aclose(self) -> None:
        await self.llm.aclose()


_DESCRIPTION, _URL = FIELD_POLICY["description"], FIELD_POLICY["canonical_url"]
_WRITTEN_MAX = 16384  # sessions: ~3 MiB; one forgotten is filtered again, no more


def _clean(pii: PiiFilter, formatted: FormattedActions, session: str) -> bool:
    """Whether the PII pass leaves every text of ``formatted`` as it is."""
    return pii.clean(_DESCRIPTION, formatted.descriptions, session) and pii.clean(
        _URL, formatted.urls, session
    )


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def _formatter(settings: Settings) -> ActionsFormatter:
    formatter = load_callable(settings.format_actions, "AC_FORMAT_ACTIONS")
    return formatter or default_format_actions


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
        ResilientLLM.from_settings(llm, settings),
        template=template,
        formatter=formatter,
        max_chars=settings.summary_max_chars,
        pii=pii,
    )
