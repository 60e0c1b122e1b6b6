"""The strict msgspec Structs derived from the models, and the input payloads and summarize
requests they decode (``schemas.fast``'s first half; ``operations`` the context topic's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import msgspec
import orjson
from msgspec.structs import asdict
from pydantic import BaseModel

from schemas.actions import ActionsPayload, SlimAction
from schemas.codec import decode
from schemas.operations import SummarizeRequest

__all__ = [
    "Action",
    "ExactPayload",
    "Payload",
    "Request",
    "built",
    "decode_payload",
    "decode_request",
    "encode_payload",
    "exact_payload",
    "exact_request",
    "payload_model",
    "payload_of",
    "payload_struct",
    "struct_of",
]


# orjson reads integers past 2**64 as floats (pydantic then rounds them): the exact
# Structs take int64 only and leave larger ones to pydantic.
_Int = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_BOUNDED: dict[Any, Any] = {int: _Int, dict[str, int]: dict[str, _Int]}


def struct_of(
    model: type[BaseModel],
    name: str,
    tag: str | None = None,
    *,
    forbid: bool = False,
    extra: tuple[tuple[str, Any, Any], ...] = (),
    **kinds: Any,
) -> type[msgspec.Struct]:
    """A msgspec Struct with ``model``'s fields, types and defaults; ``kinds`` replaces the
    types of nested models (Structs of their own); ``tag``: the value of an ``op`` field;
    ``forbid``: unknown fields refused; ``extra``: (name, type, default) fields it lacks."""
    fields: list[Any] = list(extra)
    for field_name, field in model.model_fields.items():
        if tag and field_name == "op":
            continue
        kind: Any = kinds.get(field_name, field.annotation)
        if forbid:  # exact: an integer orjson would read as a float goes to pydantic
            kind = _BOUNDED.get(kind, kind)
        if field.default_factory is not None:
            factory = field.default_factory
            fields.append((field_name, kind, msgspec.field(default_factory=factory)))  # type: ignore[arg-type]
        elif field.is_required():
            fields.append((field_name, kind))
        else:
            fields.append((field_name, kind, field.default))
    # Tagged: ``op`` read as the models' is (a class attribute, not a field).
    options: dict[str, Any] = (
        {"tag_field": "op", "tag": tag, "namespace": {"op": tag}} if tag else {}
    )
    return msgspec.defstruct(name, fields, kw_only=True, forbid_unknown_fields=forbid, **options)


_ACTION_FIELDS = frozenset(SlimAction.model_fields)
_PAYLOAD_FIELDS = frozenset(ActionsPayload.model_fields)
_set, _new = object.__setattr__, object.__new__
M = TypeVar("M", bound=BaseModel)


def built(model: type[M], fields: dict[str, Any], names: frozenset[str]) -> M:
    """``model`` holding ``fields`` (every field, already valid), as ``model_construct``
    builds it without its per-field default handling: a third of the cost. Checked
    against pydantic at import (:func:`_check`), else ``model_construct`` is used."""
    obj = _new(model)
    _set(obj, "__dict__", fields)
    _set(obj, "__pydantic_fields_set__", set(names))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


# What the accumulator carries instead of the models (no model built per payload): their
# fields, in their order, with their defaults, so a Payload encodes to the JSON pydantic
# writes, but floats from 1e16 up written 1e16, not 1e+16: the same numbers. Its values
# are the model's: ``count`` is ``len(actions)``, "" user_id/email None.
# tests/unit/test_fast_exact.py::test_the_structs_are_the_models.
Action = struct_of(SlimAction, "Action")
if TYPE_CHECKING:  # built from the models at import: a type checker sees values of any type
    Payload = Any
else:
    Payload = struct_of(ActionsPayload, "Payload", actions=list[Action])


def _values(s: Any) -> Payload:
    """A decoded :data:`ExactPayload` with the model's own mappings: ``count`` is
    ``len(actions)``, "" user_id/email None, the input's ``type`` dropped."""
    return Payload(
        product_id=s.product_id,
        session_id=s.session_id,
        user_id=s.user_id or None,
        email=s.email or None,
        actions=s.actions,  # ExactActions: Action's fields, in its order
        count=len(s.actions),
        forwarded_at=s.forwarded_at,
        conversation_id=s.conversation_id,
    )


def payload_of(struct: Any) -> ActionsPayload:
    """The :class:`ActionsPayload` of a decoded :data:`ExactPayload` or a :data:`Payload`, not
    validated again."""
    fields = asdict(_values(struct))
    fields["actions"] = [built(SlimAction, asdict(a), _ACTION_FIELDS) for a in struct.actions]
    return built(ActionsPayload, fields, _PAYLOAD_FIELDS)


def payload_model(payload: ActionsPayload | Payload) -> ActionsPayload:
    """The model of a :data:`Payload` (a model is returned as it is): for user code."""
    return payload if isinstance(payload, ActionsPayload) else payload_of(payload)


# The exact path: strict Structs that refuse unknown fields (msgspec skips those without
# the checks orjson makes: invalid UTF-8, 1e400), so whatever they accept, pydantic
# accepts as the same model; everything else goes to pydantic for its answer.
# tests/unit/test_fast_decode.py (hypothesis, pydantic the oracle) proves it.
ExactAction = struct_of(SlimAction, "ExactAction", forbid=True)
ExactPayload = struct_of(
    ActionsPayload,
    "ExactPayload",
    forbid=True,
    extra=(("type", str, "actions"),),  # the connector's event type
    actions=list[ExactAction],  # type: ignore[valid-type]
)
_Request = struct_of(
    SummarizeRequest,
    "RequestStruct",
    forbid=True,
    batches=list[ExactPayload],  # type: ignore[valid-type]
)  # its ledger a SessionLedger: a Struct that refuses unknown fields, exact as it is
# What the summarize stage takes: the model's values, its batches as Payloads, a ledger
# (sent by an accumulator before session 21) as the model's JSON form.
if TYPE_CHECKING:
    Request = Any
else:
    Request = struct_of(
        SummarizeRequest, "Request", batches=list[Payload], ledger=dict[str, Any] | None
    )
_input_decoder = msgspec.json.Decoder(ExactPayload)
_request_decoder = msgspec.json.Decoder(_Request)


def _check() -> None:
    """Fall back to ``model_construct`` if this pydantic keeps its models differently."""
    global built
    sample = ActionsPayload(session_id="s", actions=[SlimAction(title="t", index=1)])
    raw = orjson.dumps(sample.model_dump(mode="json"))
    try:
        fast = payload_of(_input_decoder.decode(raw))
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


def exact_payload(struct: Any) -> bool:
    """Whether pydantic gives this Struct's model (else it refuses it)."""
    sid = struct.session_id
    return bool(sid) and "\x1f" not in sid


_encoder = msgspec.json.Encoder()
encode_payload = _encoder.encode  # a Payload's JSON: the stored batch, an operation's payload


def payload_struct(payload: ActionsPayload) -> Payload:
    """The :class:`Payload` of a validated model (input pydantic had to read, merges)."""
    return msgspec.convert(payload.model_dump(), Payload)


def decode_payload(raw: bytes | None) -> Payload:
    """An input payload: the values ``decode(ActionsPayload, raw)`` gives, or its
    refusal, at a fifth of its cost: no model is built (test_fast_exact.py)."""
    if raw is not None:
        try:
            s: Any = _input_decoder.decode(raw)
        except msgspec.MsgspecError:
            pass
        else:
            if exact_payload(s):
                return _values(s)
    return payload_struct(decode(ActionsPayload, raw))


def exact_request(r: Any, batches: int) -> bool:
    """SeqRange's bounds and SummarizeRequest's ``_ordered`` (a final may be empty)."""
    ordered = r.seq_to >= r.seq_from or (r.final and not batches and r.seq_from == r.seq_to + 1)
    return r.seq_from >= 1 and r.seq_to >= 1 and r.generation >= 0 and ordered


def decode_request(raw: bytes | None) -> Request:
    """A summarize request: the values ``decode(SummarizeRequest, raw)`` gives, or its
    refusal, as a :data:`Request`: its K batches are Payload Structs, no model is built
    (17 against 50 µs a request of 13 actions; test_fast_exact.py)."""
    if raw is not None:
        try:
            struct: Any = _request_decoder.decode(raw)
        except msgspec.MsgspecError:
            pass
        else:
            if exact_request(struct, len(struct.batches)) and all(
                map(exact_payload, struct.batches)
            ):
                fields = asdict(struct)
                fields["batches"] = [_values(b) for b in struct.batches]
                if struct.ledger is not None:
                    fields["ledger"] = msgspec.to_builtins(struct.ledger)
                return Request(**fields)
    return msgspec.convert(decode(SummarizeRequest, raw).model_dump(), Request)
