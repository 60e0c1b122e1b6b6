"""One exception hierarchy: every project error derives from :class:`AgentContextError`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from schemas.errors import AgentContextError

__all__ = ["AgentContextError", "ConfigurationError", "stop_on_configuration_error"]


class ConfigurationError(AgentContextError):
    """An invalid setting or plug-in, found at start-up; its message is one readable line."""


@contextmanager
def stop_on_configuration_error() -> Iterator[None]:
    """For entry points (worker modules, scripts): a :class:`ConfigurationError` ends the
    process with its message and exit code 1, no traceback (tests/integration/test_pipeline.py)."""
    try:
        yield
    except ConfigurationError as exc:
        raise SystemExit(str(exc)) from None
