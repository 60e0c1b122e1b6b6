"""HMAC signatures of webhook bodies: ``<algorithm>=<hex digest>`` over the exact bytes.

One implementation for every signature the service makes or checks: the
connector's ``X-Connector-Signature`` (sha256, what the SDK's receiver verifies)
and Intercom's ``X-Hub-Signature`` (sha1, keyed with the app's client secret).
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["sign", "verify"]


def sign(secret: str | bytes, body: bytes, algorithm: str = "sha256") -> str:
    """The header value for ``body``, e.g. ``sha256=9f86d0...``."""
    key = secret.encode() if isinstance(secret, str) else secret
    return f"{algorithm}={hmac.new(key, body, getattr(hashlib, algorithm)).hexdigest()}"


def verify(secret: str | bytes, body: bytes, given: str | None, algorithm: str = "sha256") -> bool:
    """Whether ``given`` (a header value) signs ``body``; constant-time, hex case ignored."""
    prefix = f"{algorithm}="
    if not given or not given.startswith(prefix):
        return False
    expected = sign(secret, body, algorithm).encode()
    provided = (prefix + given[len(prefix) :].strip().lower()).encode("utf-8", "replace")
    return hmac.compare_digest(expected, provided)
