"""Objects named by a dotted path in the settings: ``pkg.module:attr`` or ``pkg.module.attr``."""

from __future__ import annotations

import pkgutil
from typing import Any

from streams.errors import ConfigurationError

__all__ = ["resolve"]


def resolve(dotted: str, setting: str | None = None) -> Any:
    """Import what ``dotted`` names (:func:`pkgutil.resolve_name`), or stop at start-up with
    one line naming the setting: ``AC_SINK: cannot import 'x.y': No module named 'x'``."""
    try:
        return pkgutil.resolve_name(dotted)
    except AttributeError as exc:
        raise ConfigurationError(f"{_where(setting)}{dotted!r} not found: {exc}") from None
    except (ImportError, ValueError) as exc:
        raise ConfigurationError(f"{_where(setting)}cannot import {dotted!r}: {exc}") from None


def _where(setting: str | None) -> str:
    return f"{setting}: " if setting else ""
