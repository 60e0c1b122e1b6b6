"""The connector's wire format: ``SlimAction`` and ``ActionsPayload``.

Field names, defaults, ``to_text()`` and ``merge()`` match
``autoplay_sdk.core.models`` so a payload the SDK accepts is accepted here with
the same values and renders to the same text. Two deliberate differences:

* a payload without a ``session_id`` is rejected: the SDK pools such payloads
  into one shared ``"unknown"`` session, which mixes unrelated users;
* mistyped fields (a string where a number belongs, an object where text
  belongs) are rejected with the field named, instead of being carried along;
* a ``session_id`` holding U+001F is rejected: that control character joins a
  session id and an index in the state tables' keys (``streams.tables``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from schemas.text import one_line_each

__all__ = ["ACTION_TEXT_FIELDS", "ActionsPayload", "SlimAction", "action_text", "numbered_text"]

_TEXT_FIELDS = ("title", "description", "canonical_url", "type", "raw_url")
_TIMESTAMP_FIELDS = ("timestamp_start", "timestamp_end")


class SlimAction(BaseModel):
    """One UI action of a user session."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    title: str = ""
    description: str = ""
    canonical_url: str = ""
    index: int = 0
    type: str = ""
    timestamp_start: float = 0.0
    timestamp_end: float = 0.0
    raw_url: str = ""
    session_id: str | None = None
    user_id: str | None = None
    email: str | None = None
    conversation_id: str | None = None

    # The SDK reads these with ``data.get(k) or <default>``: null means default.
    @field_validator(*_TEXT_FIELDS, mode="before")
    @classmethod
    def _null_text_is_empty(cls, value: Any) -> Any:
        return "" if value is None else value

    @field_validator("index", mode="before")
    @classmethod
    def _null_index_is_zero(cls, value: Any) -> Any:
        return 0 if value is None else value

    @field_validator(*_TIMESTAMP_FIELDS, mode="before")
    @classmethod
    def _null_timestamp_is_zero(cls, value: Any) -> Any:
        return 0.0 if value is None else value

    def to_text(self) -> str:
        """``[{index}] {type}: {description} — {canonical_url}``, as the SDK."""
        return action_text(self)


class ActionsPayload(BaseModel):
    """A batch of actions of one session, as the connector forwards it."""

    model_config = ConfigDict(extra="ignore")

    product_id: str = ""
    session_id: str = Field(min_length=1)
    user_id: str | None = None
    email: str | None = None
    actions: list[SlimAction] = Field(default_factory=list)
    count: int = 0
    forwarded_at: float = 0.0
    conversation_id: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _sdk_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"an actions payload must be a JSON object, got {type(data).__name__}")
        if not data.get("session_id"):
            # The SDK would file this under "unknown", shared by every anonymous user.
            raise ValueError("session_id is missing or empty; refusing to pool it with others")
        fixed = dict(data)
        fixed.pop("count", None)  # ignored, as by the SDK: len(actions) is authoritative
        for key, default in (("product_id", ""), ("forwarded_at", 0.0)):
            if fixed.get(key) is None:
                fixed[key] = default
        for key in ("user_id", "email"):  # the SDK maps "" to None here
            fixed[key] = fixed.get(key) or None
        if fixed.get("actions") is None:
            fixed["actions"] = []
        return fixed

    @field_validator("session_id")
    @classmethod
    def _no_key_separator(cls, value: str) -> str:
        if "\x1f" in value:
            raise ValueError("session_id must not contain U+001F (it separates table keys)")
        return value

    @model_validator(mode="after")
    def _count_is_len_actions(self) -> Self:
        # The SDK treats len(actions) as authoritative; so do we.
        self.count = len(self.actions)
        return self

    @classmethod
    def merge(cls, payloads: list[ActionsPayload]) -> ActionsPayload:
        """Concatenate batches of one session, re-indexed from 0 (SDK semantics)."""
        if not payloads:
            raise ValueError("ActionsPayload.merge() requires at least one payload")
        first = payloads[0]
        actions = [
            action.model_copy(update={"index": i})
            for i, action in enumerate(a for p in payloads for a in p.actions)
        ]
        return cls.model_construct(
            product_id=first.product_id,
            session_id=first.session_id,
            user_id=next((p.user_id for p in payloads if p.user_id), None),
            email=next((p.email for p in payloads if p.email), None),
            actions=actions,
            count=len(actions),
            forwarded_at=max(p.forwarded_at for p in payloads),
            conversation_id=next((p.conversation_id for p in payloads if p.conversation_id), None),
        )

    def to_text(self) -> str:
        """The SDK's plain-text rendering: a header line, then one line per action."""
        lines = [f"Session {self.session_id} — {len(self.actions)} actions"]
        lines.extend(action.to_text() for action in self.actions)
        return "\n".join(lines)

    def numbered_text(self, seq_from: int) -> str:
        """:func:`numbered_text` of this payload."""
        return numbered_text(self.session_id, self.actions, seq_from)


def action_text(action: SlimAction) -> str:
    """:meth:`SlimAction.to_text` of a SlimAction or its Struct (``schemas.fast.Action``)."""
    return f"[{action.index}] {action.type}: {action.description} — {action.canonical_url}"


# What action_text reads: the default prompt's PII pass filters these fields only
# (test_summarize.py::test_the_default_prompt_is_filtered_on_the_fields_it_reads).
ACTION_TEXT_FIELDS = frozenset({"index", "type", "description", "canonical_url"})


def numbered_text(session_id: str, actions: Sequence[SlimAction], seq_from: int) -> str:
    """The context's rendering of a batch: lines numbered with the session's sequence
    numbers, the numbers summary ranges use ("Summary of actions 1-12" is followed by
    [13]), not the SDK's per-batch ``index``. ``actions``: SlimActions or their Structs
    (``schemas.fast.Action``)."""
    n = len(actions)
    span = f"action {seq_from}" if n == 1 else f"actions {seq_from}-{seq_from + n - 1}"
    lines = [f"Session {session_id} — {span}"]
    for seq, a in enumerate(actions, seq_from):
        lines.append(f"[{seq}] {a.type}: {a.description} — {a.canonical_url}")
    return one_line_each(lines)
