"""The PII filter: personal data in actions becomes placeholders before it leaves.

``AC_PII=llm`` (the default) filters what goes into LLM prompts; ``llm,destinations``
filters at the accumulator, so the context text, the ledger, the stored batches and
every summary hold placeholders too; ``off`` turns it off.

Placeholders are ``<TYPE_tag>``: the tag is an HMAC of (session, type, canonical value)
keyed with ``AC_PII_KEY``, six letters. So the same email is the same ``<EMAIL_…>``
everywhere in a session (the model can still reason about "the same person"), differs
across sessions, and no mapping exists anywhere: nothing to store, leak or send. The
tag has no digits, so no later detector mistakes a placeholder for a number. Without
``AC_PII_KEY`` a random per-process key serves: placeholders then change when a
session's summaries move to another worker or the worker restarts (a warning says so).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import secrets as random_secrets
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import unquote, unquote_plus

import msgspec
from pydantic import BaseModel

from agents.pii.detectors import BUILT_IN, Detector, Phones, Span, regex_detector
from schemas import ActionsPayload
from schemas.fast import Payload
from schemas.text import PII_PLACEHOLDER
from streams.observe import metrics
from streams.settings import ConfigurationError, Settings

__all__ = ["FIELD_POLICY", "PiiFilter", "build_pii_filter"]

log = logging.getLogger(__name__)

_PROCESS_KEY = random_secrets.token_bytes(32)
_TAG_LETTERS = "abcdefghijkmnpqrstuvwxyz"  # no l, o: not read as 1, 0
PLACEHOLDER = PII_PLACEHOLDER

# Which fields are filtered, and how: "text" runs every detector; "url" also reads
# percent-encoded values; a type name replaces the whole field (it is PII by definition).
FIELD_POLICY: dict[str, str] = {
    "title": "text",
    "description": "text",
    "canonical_url": "url",
    "raw_url": "url",
    "user_id": "text",
    "email": "EMAIL",
}
_PAYLOAD_FIELDS = ("user_id", "email")
P = TypeVar("P", ActionsPayload, Payload)  # the summarizer's models, the accumulator's Structs
_CACHED_CHARS = 512  # fields, not summaries: bounds the cache's memory to a few MiB
_ACTION_FIELDS = tuple(FIELD_POLICY)

# Query-string values whose names look sensitive are replaced whatever they hold.
_QUERY = re.compile(r"(?<=[?&#])([^=&#?\s]+)=([^&#\s\"'<>]*)")
_SENSITIVE_NAME = re.compile(
    r"(?i)token|secret|passw|pwd|e-?mail|session|sessid|^sid$|auth|^code$|_code$|signature"
    r"|^sig$|credential|otp|phone|ssn|jwt|apikey|(?:^|[_-])key(?:$|[_-])|key$"
)


class PiiFilter:
    def __init__(
        self,
        *,
        key: bytes,
        llm: bool = True,
        destinations: bool = False,
        detectors: Iterable[tuple[str, Detector]] | None = None,
        _cache: int = 4096,
    ) -> None:
        self._key = key
        self.llm = llm
        self.destinations = destinations
        default: list[tuple[str, Detector]] = [*BUILT_IN, ("PHONE", Phones("US"))]
        self._detectors = list(default if detectors is None else detectors)
        # Titles and URLs repeat: a field's result per (session, policy, text), with the kinds
        # it detected (replayed to the metric); 0 = the plain path (test_fast_path_is_exact_*).
        self._cache_size = _cache
        self._clean: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._redacted: OrderedDict[tuple[str, str, str], tuple[str, tuple[str, ...]]] = (
            OrderedDict()
        )

    def placeholder(self, kind: str, value: str, session_key: str) -> str:
        message = f"{session_key}\x1f{kind}\x1f{value}".encode()
        digest = hmac.new(self._key, message, hashlib.sha256).digest()
        tag = "".join(_TAG_LETTERS[b % len(_TAG_LETTERS)] for b in digest[:6])
        return f"<{kind}_{tag}>"

    def _replace(
        self, text: str, kind: str, found: Iterable[Span], session_key: str, hits: list[str]
    ) -> str:
        found = list(found)
        if not found:  # a custom detector's generator that yielded nothing
            return text
        taken = [(m.start(), m.end()) for m in PLACEHOLDER.finditer(text)]
        spans: list[Span] = []
        for start, end, value in sorted(found, key=lambda s: (s[0], -s[1])):
            if start < end and not any(start < b and a < end for a, b in taken):
                spans.append((start, end, value))
                taken.append((start, end))
        for start, end, value in reversed(spans):
            hits.append(kind)
            text = text[:start] + self.placeholder(kind, value, session_key) + text[end:]
        return text

    def _query_values(self, text: str, session_key: str, hits: list[str]) -> str:
        def replace(m: re.Match[str]) -> str:
            name, value = m.group(1), m.group(2)
            if not value or PLACEHOLDER.search(value):
                return m.group(0)
            decoded = unquote_plus(value)
            # A value may be a URL with a query of its own: a redirect's ?code=, ?token=
            # (test_pii.py::test_detectors_find_and_replace[...next=...code...]).
            redacted = self._redact(decoded, session_key, "text", hits)
            if redacted != decoded:
                return f"{name}={redacted}"
            if _SENSITIVE_NAME.search(unquote(name)):
                hits.append("TOKEN")
                return f"{name}={self.placeholder('TOKEN', decoded, session_key)}"
            return m.group(0)

        return _QUERY.sub(replace, text) if "=" in text else text

    def _detectors_on(self, text: str, session_key: str, hits: list[str]) -> str:
        for kind, detector in self._detectors:
            found = detector(text)
            if found:  # most fields: an empty list, no placeholder scan, no sort
                text = self._replace(text, kind, found, session_key, hits)
        return text

    def redact_text(self, text: str, session_key: str, policy: str = "text") -> str:
        """``text`` with every detection replaced by its placeholder (idempotent)."""
        out, hits = self._filtered(text, session_key, policy)
        for kind in hits:
            metrics.PII_DETECTIONS.labels(kind).inc()
        return out

    def _filtered(self, text: str, session_key: str, policy: str) -> tuple[str, Sequence[str]]:
        """``text`` filtered and what was found in it, remembered (a clean text in every
        session, a changed one in its own), counted nowhere."""
        if not text:
            return text, ()
        if not self._cache_size or len(text) > _CACHED_CHARS:
            hits: list[str] = []
            return self._redact(text, session_key, policy, hits), hits
        if (policy, text) in self._clean:  # nothing found: the same in every session
            self._clean.move_to_end((policy, text))
            return text, ()
        if (key := (session_key, policy, text)) in self._redacted:
            self._redacted.move_to_end(key)
            return self._redacted[key]
        hits = []
        out = self._redact(text, session_key, policy, hits)
        if out == text and not hits:
            self._clean[policy, text] = None
            if len(self._clean) > self._cache_size:
                self._clean.popitem(last=False)
            return text, ()
        self._redacted[key] = (out, tuple(hits))
        if len(self._redacted) > self._cache_size:
            self._redacted.popitem(last=False)
        return out, hits

    def _redact(self, text: str, session_key: str, policy: str, hits: list[str]) -> str:
        if policy not in ("text", "url"):
            if PLACEHOLDER.fullmatch(text):
                return text
            hits.append(policy)
            return self.placeholder(policy, text.strip().lower(), session_key)
        if policy == "url" and "%" in text:
            decoded = unquote(text)  # an email in a path is often percent-encoded
            redacted = self._redact(decoded, session_key, "text", hits)
            if redacted != decoded:
                return redacted
        text = self._query_values(text, session_key, hits)
        return self._detectors_on(text, session_key, hits)

    def clean(self, policy: str, texts: Iterable[str], session_key: str) -> bool:
        """Whether ``redact_text`` would leave each of ``texts`` as it is. False at the first
        it would change, counted nowhere: the caller's ``redact`` counts it, once."""
        for text in texts:
            out, hits = self._filtered(text, session_key, policy)
            if hits or out != text:
                return False
        return True

    def redact(
        self, payloads: list[P], session_key: str, fields: Collection[str] | None = None
    ) -> list[P]:
        """The payloads with every field of :data:`FIELD_POLICY` filtered, or only those of
        ``fields`` (what a prompt reads): new ones where something was found, else the same
        objects (the input is never modified)."""
        action_fields: tuple[str, ...] = _ACTION_FIELDS
        payload_fields: tuple[str, ...] = _PAYLOAD_FIELDS
        if fields is not None:
            action_fields = tuple(n for n in action_fields if n in fields)
            payload_fields = tuple(n for n in payload_fields if n in fields)
        return [self._payload(p, session_key, action_fields, payload_fields) for p in payloads]

    def _fields(self, obj: object, names: Iterable[str], session_key: str) -> dict[str, object]:
        update: dict[str, object] = {}
        clean = self._clean
        for name in names:
            value = getattr(obj, name)
            if value:
                policy = FIELD_POLICY[name]
                # redact_text's commonest answer looked up here: 0.17 µs a field less
                # (docs/performance.md; test_pii.py::test_fast_path_is_exact_*).
                if (policy, value) in clean:
                    clean.move_to_end((policy, value))
                    continue
                redacted = self.redact_text(value, session_key, policy)
                if redacted != value:
                    update[name] = redacted
        return update

    def _payload(
        self,
        payload: P,
        session_key: str,
        action_fields: tuple[str, ...],
        payload_fields: tuple[str, ...],
    ) -> P:
        actions, changed = [], False
        for action in payload.actions:
            update = self._fields(action, action_fields, session_key)
            actions.append(_copy(action, update) if update else action)
            changed = changed or bool(update)
        changes = self._fields(payload, payload_fields, session_key)
        if not (changed or changes):
            return payload  # nothing found: the same values, without a copy (test_pii.py)
        changes["actions"] = actions
        return _copy(payload, changes)


def _copy(obj: Any, update: dict[str, Any]) -> Any:
    """A copy of a model (the summarizer's) or a Struct (the accumulator's) with ``update``."""
    if isinstance(obj, BaseModel):
        return obj.model_copy(update=update)
    return msgspec.structs.replace(obj, **update)


def _custom_detectors(settings: Settings) -> list[tuple[str, Detector]]:
    return [(name, regex_detector(pattern)) for name, pattern in settings.pii_pattern_list()]


def build_pii_filter(settings: Settings) -> PiiFilter | None:
    """The filter per ``AC_PII``, or None when it is off; checked at start-up."""
    if settings.pii == "off":
        return None
    detectors: list[tuple[str, Detector]] = [
        *BUILT_IN,
        ("PHONE", Phones(settings.pii_phone_region)),
    ]
    detectors += _custom_detectors(settings)
    if settings.pii_ner:
        from agents.pii.presidio import presidio_detectors

        try:
            detectors += presidio_detectors()
        except ImportError as exc:
            raise ConfigurationError(
                f"AC_PII_NER needs the 'pii-ner' extra (Microsoft Presidio): {exc}"
            ) from None
    if settings.pii_key is None:
        log.warning(
            "AC_PII_KEY is not set: PII placeholders use a random key of this process, "
            "so they change when a session moves to another worker or this one restarts"
        )
        key = _PROCESS_KEY
    else:
        key = settings.pii_key.get_secret_value().encode()
    return PiiFilter(
        key=key,
        llm=True,
        destinations="destinations" in settings.pii,
        detectors=detectors,
    )
