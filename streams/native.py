"""The compiled hot paths (``native/``: the ``agent_context_native`` extension), or None
where it is not built: each caller then runs its Python twin, which does the same work
(``agents.accumulate.compiled``, ``streams.partitions``; tests/unit/test_compiled.py and
test_partitions.py compare them)."""

from __future__ import annotations

from types import ModuleType

__all__ = ["native"]

try:
    import agent_context_native as _built
except ImportError:  # not built: bootstrap.sh builds it wherever cargo is
    _built = None

native: ModuleType | None = _built
