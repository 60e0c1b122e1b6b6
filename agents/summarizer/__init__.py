"""The summarizer: prompts, the LLM client and its resilience, the offline fallback, costs."""

from agents.summarizer.breaker import BreakerOpen, CircuitBreaker
from agents.summarizer.build import LLMSummarizer, build_summarizer
from agents.summarizer.costs import Accounting, CostReport
from agents.summarizer.llm import (
    Completion,
    LLMCallable,
    LLMError,
    OpenAIChat,
    Usage,
    llm_session,
    load_llm_callable,
    openai_llm,
    usage_of,
)
from agents.summarizer.offline import OfflineSummarizer, offline_summary
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
from agents.summarizer.resilience import FailureLog, LLMUnavailable, ResilientLLM

__all__ = [
    "DEFAULT_PROMPT",
    "Accounting",
    "ActionsFormatter",
    "BreakerOpen",
    "CircuitBreaker",
    "Completion",
    "CostReport",
    "FailureLog",
    "FormattedActions",
    "LLMCallable",
    "LLMError",
    "LLMSummarizer",
    "LLMUnavailable",
    "OfflineSummarizer",
    "OpenAIChat",
    "ResilientLLM",
    "Summarizer",
    "Usage",
    "build_prompt",
    "build_summarizer",
    "cap_summary",
    "default_format_actions",
    "llm_session",
    "load_llm_callable",
    "offline_summary",
    "openai_llm",
    "usage_of",
    "validate_template",
]
