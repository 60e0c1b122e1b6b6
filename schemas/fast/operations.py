"""The context topic's operations decoded with the strict Structs of ``structs``: the
models, or for a sink that delivers nothing the Structs themselves (no model built)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import orjson
from msgspec.structs import asdict
from pydantic import Field, TypeAdapter, ValidationError

from schemas.codec import InvalidMessage, describe
from schemas.fast.structs import ExactPayload, built, exact_payload, payload_of, struct_of
from schemas.operations import (
    ActionsWritten,
    SessionErased,
    SummaryReady,
    SummaryUsage,
    context_message_adapter,
)

__all__ = ["SummaryStruct", "WrittenHeader", "decode_context_message", "header_model"]


# The context topic's messages, with the same exact Structs; a summary's usage stays a
# plain value validated by pydantic (once per K actions).
_WrittenStruct: Any = struct_of(
    ActionsWritten, "WrittenStruct", "actions_written", forbid=True, payload=ExactPayload
)
_SummaryStruct: Any = struct_of(
    SummaryReady, "SummaryStruct", "summary_ready", forbid=True, usage=Any
)
_ErasedStruct: Any = struct_of(SessionErased, "ErasedStruct", "session_erased", forbid=True)
_message_decoder = msgspec.json.Decoder(_WrittenStruct | _SummaryStruct | _ErasedStruct)  # type: ignore[valid-type]
# For a sink that does not read the payload: any JSON value there, skipped unparsed.
_HeaderStruct: Any = struct_of(
    ActionsWritten, "HeaderStruct", "actions_written", forbid=True, payload=msgspec.Raw
)
_header_decoder = msgspec.json.Decoder(_HeaderStruct | _SummaryStruct | _ErasedStruct)  # type: ignore[valid-type]
# The operations as a sink that delivers nothing reads them, valid: an ``actions_written``'s
# header fields, a ``summary_ready`` whole (its usage the plain value pydantic checked).
if TYPE_CHECKING:
    WrittenHeader = Any
    SummaryStruct = Any
else:
    WrittenHeader, SummaryStruct = _HeaderStruct, _SummaryStruct


class _UnreadPayload(ActionsWritten):
    """``actions_written`` as a sink that does not read the payload validates it."""

    payload: Any  # type: ignore[assignment]


_header_adapter: TypeAdapter[_UnreadPayload | SummaryReady | SessionErased] = TypeAdapter(
    Annotated[_UnreadPayload | SummaryReady | SessionErased, Field(discriminator="op")]
)
_NAMES = {
    model: frozenset(model.model_fields) for model in (ActionsWritten, SummaryReady, SessionErased)
}


def decode_context_message(
    raw: bytes, *, payload: bool = True, header: bool = False
) -> ActionsWritten | SummaryReady | SessionErased | WrittenHeader:
    """An operation on ``context``, equal to ``context_message_adapter``'s validation of it.
    ``payload=False`` (a sink that does not read it): an ``actions_written``'s payload may
    be any JSON value, neither parsed nor checked, and is None: a third of the decode.
    ``header`` (with ``payload=False``): such an ``actions_written`` as the
    :data:`WrittenHeader` Struct msgspec decoded and a ``summary_ready`` as its
    :data:`SummaryStruct`, their fields the model's (no model built; :func:`header_model`
    builds it), where the fast path takes them.

    What our stages wrote is decoded with msgspec; anything it does not take as is (a
    null for a default, an unknown op, a constraint of the models) goes to pydantic,
    which either takes it or says why not (tests/unit/test_fast_decode.py)."""
    try:
        struct = (_message_decoder if payload else _header_decoder).decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        found = None
    else:
        if header and type(struct) is not _ErasedStruct and _valid_range(struct):
            if type(struct) is _HeaderStruct or _valid_usage(struct):
                return struct  # type: ignore[no-any-return]
        found = _fast_message(struct)
    if found is not None:
        return found
    try:
        if payload:
            return context_message_adapter.validate_python(orjson.loads(raw))
        validated = _header_adapter.validate_python(orjson.loads(raw))
    except orjson.JSONDecodeError as exc:
        raise InvalidMessage(f"invalid context operation: not valid JSON: {exc}") from None
    except ValidationError as exc:
        raise InvalidMessage(f"invalid context operation: {describe(exc)}") from None
    if isinstance(validated, _UnreadPayload):
        fields = {**validated.__dict__, "payload": None}
        return built(ActionsWritten, fields, frozenset(validated.model_fields_set))
    return validated


def _valid_range(struct: Any) -> bool:
    """SeqRange's bounds and order."""
    return bool(1 <= struct.seq_from <= struct.seq_to and struct.generation >= 0)


def _usage(struct: Any) -> SummaryUsage | None:
    """A decoded summary's usage as pydantic takes it (None: the offline summarizer);
    raises ValueError where pydantic refuses it."""
    return None if struct.usage is None else SummaryUsage.model_validate(struct.usage)


def _valid_usage(struct: Any) -> bool:
    try:
        _usage(struct)
    except ValueError:
        return False
    return True


def header_model(header: WrittenHeader | SummaryStruct) -> ActionsWritten | SummaryReady:
    """The model of what ``decode_context_message(..., header=True)`` gave as a Struct: what
    ``payload=False`` gives for the same bytes (an ``actions_written``'s payload None)."""
    if type(header) is _SummaryStruct:
        model = _fast_message(header)
        assert isinstance(model, SummaryReady)  # decode_context_message checked it
        return model
    fields = asdict(header)
    fields["op"], fields["payload"] = "actions_written", None  # not read: not checked
    return built(ActionsWritten, fields, _NAMES[ActionsWritten])


def _fast_message(struct: Any) -> ActionsWritten | SummaryReady | SessionErased | None:
    """The model of a decoded Struct, or None where pydantic would change or refuse it."""
    if isinstance(struct, _ErasedStruct):
        fields = asdict(struct)
        fields["op"] = "session_erased"
        return built(SessionErased, fields, _NAMES[SessionErased])
    if not _valid_range(struct):
        return None
    if isinstance(struct, _HeaderStruct):
        return header_model(struct)
    fields = asdict(struct)
    if isinstance(struct, _WrittenStruct):
        if not exact_payload(struct.payload):
            return None  # refused by ActionsPayload's validators
        fields["op"] = "actions_written"
        fields["payload"] = payload_of(struct.payload)
        return built(ActionsWritten, fields, _NAMES[ActionsWritten])
    fields["op"] = "summary_ready"  # its ledger decoded as it is: a Struct
    try:
        fields["usage"] = _usage(struct)
    except ValueError:
        return None
    return built(SummaryReady, fields, _NAMES[SummaryReady])
