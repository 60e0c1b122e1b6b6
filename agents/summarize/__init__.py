"""The summarize agent: its stage (``stage``) and the rolling-summary state (``state``)."""

from __future__ import annotations

from faust.types import TableT

from agents.summarize.stage import SummarizeStage
from agents.summarize.state import CARRY_MAX_BYTES, SummaryState, fold_large_carry, offline_fold
from agents.summarizer import Summarizer
from streams.app import ContextApp
from streams.topics import Topics

__all__ = [
    "CARRY_MAX_BYTES",
    "SummarizeStage",
    "SummaryState",
    "fold_large_carry",
    "offline_fold",
    "register",
]


def register(app: ContextApp, topics: Topics, summarizer: Summarizer) -> TableT[str, bytes]:
    """Declare the summaries table, the agent and its timer on ``app``."""
    stage = SummarizeStage(app, topics, summarizer)
    app.task(stage.run)
    if closer := getattr(summarizer, "aclose", None):  # plug-ins may hold no client
        app.at_shutdown(closer)  # the LLM client's connections (test_llm.py)
    app.timer(max(app.settings.idle_timeout_s, 1.0), name="summarize.forget_closed")(
        stage.forget_closed
    )
    return stage.table
