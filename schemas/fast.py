"""Our own messages decoded once, with msgspec, into the pydantic models.

The pydantic models of this package stay the contract: they validate what comes
from outside and are what every stage and sink is handed. What our own stages
wrote (a stored batch, a context operation, a summarize request) was dumped from
those models, so it has their canonical shape: msgspec Structs derived from the
models (:func:`struct_of`, one source of truth) decode it strictly, and
``model_construct`` turns it into the same models without a second validation,
at a fraction of pydantic's cost (``python -m scripts.bench.codecs``).
tests/unit/test_fast_decode.py proves the two paths give equal models.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
import orjson
from msgspec.structs import asdict
from pydantic import BaseModel, ValidationError

from schemas.actions import ActionsPayload, SlimAction
from schemas.codec import InvalidMessage, describe
from schemas.ledger import SessionLedger
from schemas.operations import (
    ActionsWritten,
    SessionErased,
    SummaryReady,
    SummaryUsage,
    context_message_adapter,
)

__all__ = [
    "PayloadStruct",
    "built",
    "decode_context_message",
    "decode_payload",
    "payload_of",
    "struct_of",
]


def struct_of(
    model: type[BaseModel], name: str, tag: str | None = None, **kinds: Any
) -> type[msgspec.Struct]:
    """A msgspec Struct with ``model``'s fields, types and defaults; ``kinds`` replaces the
    types of nested models (Structs of their own); ``tag``: the value of an ``op`` field."""
    fields: list[Any] = []
    for field_name, field in model.model_fields.items():
        if tag and field_name == "op":
            continue
        kind = kinds.get(field_name, field.annotation)
        if field.default_factory is not None:
            factory = field.default_factory
            fields.append((field_name, kind, msgspec.field(default_factory=factory)))  # type: ignore[arg-type]
        elif field.is_required():
            fields.append((field_name, kind))
        else:
            fields.append((field_name, kind, field.default))
    if tag:
        return msgspec.defstruct(name, fields, kw_only=True, tag_field="op", tag=tag)
    return msgspec.defstruct(name, fields, kw_only=True)


ActionStruct = struct_of(SlimAction, "ActionStruct")
PayloadStruct = struct_of(ActionsPayload, "PayloadStruct", actions=list[ActionStruct])  # type: ignore[valid-type]

_ACTION_FIELDS = frozenset(SlimAction.model_fields)
_PAYLOAD_FIELDS = frozenset(ActionsPayload.model_fields)
_payload_decoder = msgspec.json.Decoder(PayloadStruct)
_set = object.__setattr__
M = TypeVar("M", bound=BaseModel)


def built(model: type[M], fields: dict[str, Any], names: frozenset[str]) -> M:
    """``model`` holding ``fields`` (every field, already valid), as ``model_construct``
    builds it without its per-field default handling: a third of the cost. Checked
    against pydantic at import (:func:`_check`), else ``model_construct`` is used."""
    obj = model.__new__(model)
    _set(obj, "__dict__", fields)
    _set(obj, "__pydantic_fields_set__", set(names))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def payload_of(struct: Any) -> ActionsPayload:
    """The :class:`ActionsPayload` of a decoded :data:`PayloadStruct`, not validated again."""
    actions = [built(SlimAction, asdict(a), _ACTION_FIELDS) for a in struct.actions]
    fields = asdict(struct)
    fields["actions"], fields["count"] = actions, len(actions)
    return built(ActionsPayload, fields, _PAYLOAD_FIELDS)


def _check() -> None:
    """Fall back to ``model_construct`` if this pydantic keeps its models differently."""
    global built
    sample = ActionsPayload(session_id="s", actions=[SlimAction(title="t", index=1)])
    raw = orjson.dumps(sample.model_dump(mode="json"))
    try:
        fast = payload_of(_payload_decoder.decode(raw))
        ok = (
            fast == sample
            and fast.model_dump() == sample.model_dump()
            and fast.actions[0].title == "t"
        )
    except Exception:  # any difference means: do not use the fast build
        ok = False
    if not ok:
        built = lambda model, fields, names: model.model_construct(**fields)  # noqa: E731


_check()


def decode_payload(raw: bytes) -> ActionsPayload:
    """A payload this service stored (``orjson.dumps(payload.model_dump(mode="json"))``)."""
    try:
        return payload_of(_payload_decoder.decode(raw))
    except msgspec.ValidationError as exc:
        raise InvalidMessage(f"invalid stored batch: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidMessage(f"not valid JSON: {exc}") from None


# The context topic's messages. Nested models of a summary (the ledger, the usage) stay
# plain values, validated by pydantic: they come once per K actions.
_WrittenStruct: Any = struct_of(
    ActionsWritten, "WrittenStruct", "actions_written", payload=PayloadStruct
)
_SummaryStruct: Any = struct_of(
    SummaryReady, "SummaryStruct", "summary_ready", ledger=Any, usage=Any
)
_ErasedStruct: Any = struct_of(SessionErased, "ErasedStruct", "session_erased")
_message_decoder = msgspec.json.Decoder(_WrittenStruct | _SummaryStruct | _ErasedStruct)  # type: ignore[valid-type]
_NAMES = {
    model: frozenset(model.model_fields) for model in (ActionsWritten, SummaryReady, SessionErased)
}


def decode_context_message(raw: bytes) -> ActionsWritten | SummaryReady | SessionErased:
    """An operation on ``context``, equal to ``context_message_adapter``'s validation of it.

    What our stages wrote is decoded with msgspec; anything it does not take as is (a
    null for a default, an unknown op, a constraint of the models) goes to pydantic,
    which either takes it or says why not (tests/unit/test_fast_decode.py)."""
    try:
        found = _fast_message(_message_decoder.decode(raw))
    except (msgspec.ValidationError, msgspec.DecodeError):
        found = None
    if found is not None:
        return found
    try:
        return context_message_adapter.validate_python(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"invalid context operation: not valid JSON: {exc}") from None
    except ValidationError as exc:
        raise InvalidMessage(f"invalid context operation: {describe(exc)}") from None


def _fast_message(struct: Any) -> ActionsWritten | SummaryReady | SessionErased | None:
    """The model of a decoded Struct, or None where pydantic would change or refuse it."""
    fields = asdict(struct)
    if isinstance(struct, _ErasedStruct):
        fields["op"] = "session_erased"
        return built(SessionErased, fields, _NAMES[SessionErased])
    if not 1 <= struct.seq_from <= struct.seq_to or struct.generation < 0:
        return None
    if isinstance(struct, _WrittenStruct):
        payload = struct.payload
        session_id = payload.session_id
        if not session_id or "\x1f" in session_id or payload.user_id == "" or payload.email == "":
            return None  # refused, or mapped to None, by ActionsPayload's validators
        fields["op"], fields["payload"] = "actions_written", payload_of(payload)
        return built(ActionsWritten, fields, _NAMES[ActionsWritten])
    fields["op"] = "summary_ready"
    try:
        if struct.ledger is not None:
            fields["ledger"] = SessionLedger.model_validate(struct.ledger)
        if struct.usage is not None:
            fields["usage"] = SummaryUsage.model_validate(struct.usage)
    except ValueError:
        return None
    return built(SummaryReady, fields, _NAMES[SummaryReady])
