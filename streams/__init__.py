"""The stream layer: the Faust app, settings, topics, tables, lanes, dead letters, errors.

Its public surface is ``__all__``, loaded on first use (so ``streams.settings`` alone
does not import Faust). ``streams.observe`` holds metrics, lag, health and stalls;
``streams._faust`` everything that patches or bypasses Faust.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from streams.app import ContextApp, create_app, require_broker
    from streams.dead_letters import DeadLetterWriter, dead_letter
    from streams.errors import AgentContextError, ConfigurationError, stop_on_configuration_error
    from streams.lanes import InOrderAcks, Lanes
    from streams.plugins import resolve
    from streams.settings import Settings, load_settings
    from streams.tables import session_keyed_table, session_table
    from streams.topics import Topics, declare_topics, ensure_topics

_EXPORTS = {
    "ContextApp": "streams.app",
    "create_app": "streams.app",
    "require_broker": "streams.app",
    "DeadLetterWriter": "streams.dead_letters",
    "dead_letter": "streams.dead_letters",
    "AgentContextError": "streams.errors",
    "ConfigurationError": "streams.errors",
    "stop_on_configuration_error": "streams.errors",
    "InOrderAcks": "streams.lanes",
    "Lanes": "streams.lanes",
    "resolve": "streams.plugins",
    "Settings": "streams.settings",
    "load_settings": "streams.settings",
    "session_keyed_table": "streams.tables",
    "session_table": "streams.tables",
    "Topics": "streams.topics",
    "declare_topics": "streams.topics",
    "ensure_topics": "streams.topics",
}

__all__ = [
    "AgentContextError",
    "ConfigurationError",
    "ContextApp",
    "DeadLetterWriter",
    "InOrderAcks",
    "Lanes",
    "Settings",
    "Topics",
    "create_app",
    "dead_letter",
    "declare_topics",
    "ensure_topics",
    "load_settings",
    "require_broker",
    "resolve",
    "session_keyed_table",
    "session_table",
    "stop_on_configuration_error",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'streams' has no attribute {name!r}")
