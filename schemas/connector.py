"""The connector's contract: what a frame is, and how a webhook body is signed.

A *frame* is the JSON object the connector sends, as an SSE ``data:`` line or a
webhook body: ``{"type": "actions", "session_id": ..., "actions": [...]}``.
:func:`parse_frame` is the one rule every ingest path applies (HTTP ingest, the
SSE bridge, the CLI's ``produce-file`` and re-drive, ``ActionsProducer.add``).

Signatures are ``<algorithm>=<hex HMAC>`` over the exact body bytes: the
connector's ``X-Connector-Signature`` (sha256, what the SDK's receiver
verifies) and Intercom's ``X-Hub-Signature`` (sha1, the app's client secret).
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import orjson

from schemas.actions import ActionsPayload
from schemas.codec import InvalidMessage, decode

__all__ = [
    "ACTIONS",
    "INTERCOM_SIGNATURE_HEADER",
    "SIGNATURE_HEADER",
    "Frame",
    "parse_actions",
    "parse_frame",
    "session_hint",
    "sign",
    "verify",
]

ACTIONS = "actions"
SIGNATURE_HEADER = "X-Connector-Signature"
INTERCOM_SIGNATURE_HEADER = "X-Hub-Signature"


@dataclass(frozen=True)
class Frame:
    """A well-formed frame: its ``type``, and its payload when that is ``"actions"``."""

    type: str
    actions: ActionsPayload | None = None


def parse_frame(raw: bytes) -> Frame:
    """Classify the bytes of one frame; raise :class:`InvalidMessage` for a malformed one.

    The rule (the connector's and the SDK's): ``type`` says what a frame is, and
    a frame without a ``type`` string is malformed, never guessed to be actions,
    even when it has ``actions``. A frame of another type (``summary``,
    ``heartbeat``, ...) is well-formed and returned with ``actions=None``: it is
    not ingested. An ``actions`` frame must be a valid :class:`ActionsPayload`.
    """
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidMessage(f"not a JSON object: {type(data).__name__}")
    kind = data.get("type")
    if kind is None:
        raise InvalidMessage("missing event type")
    if not isinstance(kind, str):
        raise InvalidMessage(f"event type is not a string: {kind!r}")
    if kind != ACTIONS:
        return Frame(kind)
    return Frame(kind, decode(ActionsPayload, raw))


def parse_actions(raw: bytes) -> ActionsPayload:
    """The payload of an ``actions`` frame; :class:`InvalidMessage` for any other frame."""
    frame = parse_frame(raw)
    if frame.actions is None:
        raise InvalidMessage(f"not an actions payload: type={frame.type!r}")
    return frame.actions


def session_hint(raw: bytes | Any) -> str | None:
    """The session a (possibly invalid) frame names, to key its dead letter; else None."""
    if isinstance(raw, bytes | bytearray):
        try:
            raw = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return None
    sid = raw.get("session_id") if isinstance(raw, dict) else None
    return sid if isinstance(sid, str) and sid else None


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
