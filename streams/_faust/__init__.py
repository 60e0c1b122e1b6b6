"""Everything that patches or bypasses Faust's internals, behind one version guard.

The modules here copy or override private methods of faust-streaming 0.15 (the
patches in ``divert``, the consumer, the stores) and of aiokafka 0.14 (its fetcher's
record sets in ``fetch`` and its fetch wait in ``consumer``, its batch builder's contract
in ``appender``, its produce requests' encoding in ``produce``); nothing outside this
package touches their internals (tests/unit/test_architecture.py, ``lint-imports``).
"""

from __future__ import annotations

import aiokafka
import faust

from streams.errors import AgentContextError

__all__ = ["SUPPORTED_AIOKAFKA", "SUPPORTED_FAUST", "UnsupportedFaustError"]

SUPPORTED_FAUST = "0.15."  # pyproject pins 0.15.3: the patched methods are copies of its own
# pyproject pins 0.14.0: ``fetch``, ``consumer``, ``appender`` and ``produce`` rely on it.
SUPPORTED_AIOKAFKA = "0.14."


class UnsupportedFaustError(AgentContextError, ImportError):
    """The installed faust-streaming is not the version these patches were written for."""


if not faust.__version__.startswith(SUPPORTED_FAUST):
    raise UnsupportedFaustError(
        f"streams._faust patches faust-streaming {SUPPORTED_FAUST}x, found {faust.__version__}: "
        "check whether each fix is still needed before changing the pin in pyproject.toml"
    )
if not aiokafka.__version__.startswith(SUPPORTED_AIOKAFKA):
    raise UnsupportedFaustError(
        f"streams._faust relies on aiokafka {SUPPORTED_AIOKAFKA}x internals, found "
        f"{aiokafka.__version__}: check fetch.py, consumer.py, appender.py and produce.py "
        "before changing the pin"
    )
