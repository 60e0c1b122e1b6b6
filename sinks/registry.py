"""Find the configured sink: a built-in name, an entry point, or a dotted path.

Entry point group ``agent_context.sinks`` lets a package add sinks without
touching this project. A target may be a sink class (with ``from_settings`` or
no-argument constructor), a factory ``(settings) -> sink``, an object with
``apply``, or anything with the SDK's ``write_actions`` /
``overwrite_with_summary`` callables (a module works).
"""

from __future__ import annotations

import inspect
import re
from importlib.metadata import entry_points
from typing import Any

from sinks.base import CallbackSink, ContextSink
from streams.plugins import resolve
from streams.settings import ConfigurationError, Settings

__all__ = ["ENTRY_POINT_GROUP", "load_sink"]

ENTRY_POINT_GROUP = "agent_context.sinks"
BUILTIN = {
    "files": "sinks.files:FilesSink",
    "stdout": "sinks.stdout:StdoutSink",
    "null": "sinks.null:NullSink",
    "intercom": "sinks.intercom:IntercomSink",
    "webhook": "sinks.webhook:WebhookSink",
    "vector": "sinks.vector:VectorSink",
    "view": "sinks.view:ViewSink",
}


def _import_target(target: str) -> Any:
    return resolve(target, "AC_SINK")  # "pkg.mod:attr", "pkg.mod.attr" or a module


def _resolve(spec: str) -> Any:
    if spec in BUILTIN:
        return _import_target(BUILTIN[spec])
    plugged = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if spec in plugged:
        return plugged[spec].load()
    if "." not in spec and ":" not in spec:  # a name, not a path: say which names exist
        names = ", ".join(sorted(BUILTIN.keys() | plugged.keys()))
        raise ConfigurationError(
            f"AC_SINK={spec!r} is not a sink name; use one of {names}, "
            "or a dotted path such as mypkg.sinks:MySink"
        )
    return _import_target(spec)


def _instantiate(target: Any, settings: Settings) -> Any:
    if hasattr(target, "from_settings"):
        return target.from_settings(settings)
    if inspect.isclass(target):
        return target()
    if inspect.isfunction(target) and not hasattr(target, "apply"):
        return target(settings)  # a factory
    return target


def _default_name(spec: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", ".", spec).strip(".")


def load_sink(spec: str, settings: Settings) -> ContextSink:
    sink = _instantiate(_resolve(spec), settings)
    if callable(getattr(sink, "apply", None)):
        if not getattr(sink, "name", None):
            sink.name = _default_name(spec)
        return sink  # type: ignore[no-any-return]
    overwrite = getattr(sink, "overwrite_with_summary", None)
    if callable(overwrite):
        return CallbackSink(
            getattr(sink, "write_actions", None),
            overwrite,
            name=_default_name(spec),
            on_connect=getattr(sink, "on_connect", None),  # the SDK's hooks, when defined
            on_disconnect=getattr(sink, "on_disconnect", None),
        )
    raise ConfigurationError(
        f"AC_SINK={spec!r} is neither a sink (apply) nor write_actions/overwrite_with_summary"
    )
