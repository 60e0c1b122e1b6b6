"""Everything that patches or bypasses Faust's internals, behind one version guard.

The modules here copy or override private methods of faust-streaming 0.15 (the
patches in ``divert``, the consumer, the stores); nothing outside this package
touches Faust's internals (tests/unit/test_architecture.py, ``lint-imports``).
"""

from __future__ import annotations

import faust

from streams.errors import AgentContextError

__all__ = ["SUPPORTED_FAUST", "UnsupportedFaustError"]

SUPPORTED_FAUST = "0.15."  # pyproject pins 0.15.3: the patched methods are copies of its own


class UnsupportedFaustError(AgentContextError, ImportError):
    """The installed faust-streaming is not the version these patches were written for."""


if not faust.__version__.startswith(SUPPORTED_FAUST):
    raise UnsupportedFaustError(
        f"streams._faust patches faust-streaming {SUPPORTED_FAUST}x, found {faust.__version__}: "
        "check whether each fix is still needed before changing the pin in pyproject.toml"
    )
