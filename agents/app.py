"""Entry point of the pipeline worker: ``faust -A agents.app worker``.

Accumulates actions per session, emits context operations, and produces
rolling summaries. Sinks run as their own workers (``sinks.app``).
"""

from __future__ import annotations

from functools import partial

from agents import accumulate, summarize
from agents.ingest.http import ingest_app_from_settings, optional_ingest_settings
from agents.summarizer import build_summarizer
from streams.app import create_app, require_broker
from streams.errors import stop_on_configuration_error
from streams.observe.lag import register_lag
from streams.observe.web import add_operational_pages
from streams.settings import load_settings
from streams.topics import declare_topics

with stop_on_configuration_error():  # one line on stderr, no traceback
    settings = load_settings()
    summarizer = build_summarizer(settings)  # validates prompt and plug-ins before consuming
    require_broker(settings)
app = create_app(settings, role="pipeline")
topics = declare_topics(app, settings)
sessions = accumulate.register(app, topics)
summaries = summarize.register(app, topics, summarizer)
add_operational_pages(app, settings)
register_lag(app)
with stop_on_configuration_error():
    ingest_settings = optional_ingest_settings()  # AC_INGEST_SECRET or AC_INGEST_ALLOW_UNSIGNED
if ingest_settings is not None:
    app.mount("/ingest", partial(ingest_app_from_settings, settings, ingest_settings))
