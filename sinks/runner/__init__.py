"""The sink runner: a sink's stage (``stage``) and what it reads (``messages``)."""

from __future__ import annotations

from faust.types import TableT

from sinks.base import ContextSink
from sinks.runner.messages import pull_view
from sinks.runner.stage import SinkStage
from streams.app import ContextApp
from streams.topics import Topics

__all__ = ["SinkStage", "pull_view", "register"]


def register(app: ContextApp, topics: Topics, sink: ContextSink) -> TableT[str, bytes]:
    """Declare the contexts table, the sink's agents and its pull view on ``app``."""
    stage = SinkStage(app, topics, sink)
    app.task(stage.run_sink)
    if stage.links is not None:
        app.task(stage.run_links)
    app.task(stage.run_redriven)
    route = app.table_route(table=stage.contexts, match_info="session_id")
    app.page("/sessions/{session_id}/context")(route(stage.session_context))
    if callable(add_routes := getattr(sink, "add_routes", None)):
        add_routes(app, stage.contexts, stage.store.load)  # e.g. the vector sink's search
    return stage.contexts
