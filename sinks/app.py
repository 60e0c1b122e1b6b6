"""Entry point of a sink worker: ``AC_SINK=files faust -A sinks.app worker``.

Each sink is its own Faust app (consumer group ``<app_id>-sink-<name>``), so a
slow or failing destination never delays the pipeline or another sink.
"""

from __future__ import annotations

from sinks import runner
from sinks.registry import load_sink
from streams.app import create_app, require_broker
from streams.errors import stop_on_configuration_error
from streams.observe.lag import register_lag
from streams.observe.web import add_operational_pages
from streams.settings import load_settings
from streams.topics import declare_topics

with stop_on_configuration_error():  # one line on stderr, no traceback
    settings = load_settings()
    sink = load_sink(settings.sink, settings)
    require_broker(settings)
app = create_app(settings, role=f"sink-{sink.name}")
topics = declare_topics(app, settings)
contexts = runner.register(app, topics, sink)
add_operational_pages(app, settings)
register_lag(app)
