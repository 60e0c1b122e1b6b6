"""The accumulate agent: its stage (``stage``), table store (``batches``) and pure state."""

from __future__ import annotations

from faust.types import TableT

from agents.accumulate.stage import Accumulator
from streams.app import ContextApp
from streams.topics import Topics

__all__ = ["Accumulator", "register"]


def register(app: ContextApp, topics: Topics) -> TableT[str, bytes]:
    """Declare the sessions table, the agent and its timers on ``app``."""
    accumulator = Accumulator(app, topics)
    settings = app.settings
    app.task(accumulator.run)
    app.timer(settings.idle_check_interval_s, name="accumulate.expire_idle")(
        accumulator.expire_idle_sessions
    )
    if settings.debounce_ms > 0:
        app.timer(max(settings.debounce_ms / 4000, 0.01), name="accumulate.flush_debounce")(
            accumulator.flush_debounced
        )
    return accumulator.sessions
