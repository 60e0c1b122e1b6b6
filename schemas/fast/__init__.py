"""Messages decoded once, with msgspec, into the pydantic models or their Structs.

The pydantic models of this package stay the contract and the oracle. Strict msgspec
Structs derived from them (:func:`struct_of`, one source of truth) decode what has the
models' canonical shape: an input payload, a summarize request, a context operation;
:func:`built` turns it into the same models without a second validation. The accumulator
keeps an input payload as a :data:`Payload` Struct with the model's values (no model at
all), the summarize stage a request as a :data:`Request` Struct (its batches Payloads),
and a sink that does not read an operation's payload neither parses nor checks it. Whatever
the Structs do not take goes to pydantic, for its model or its one-line refusal.
tests/unit/test_fast_exact.py and test_fast_decode.py prove the two paths agree.
"""

from schemas.fast.operations import (
    SummaryStruct,
    WrittenHeader,
    decode_context_message,
    header_model,
)
from schemas.fast.structs import (
    Action,
    Payload,
    Request,
    built,
    decode_payload,
    decode_request,
    encode_payload,
    exact_request,
    payload_model,
    payload_of,
    payload_struct,
    struct_of,
)

__all__ = [
    "Action",
    "Payload",
    "Request",
    "SummaryStruct",
    "WrittenHeader",
    "built",
    "decode_context_message",
    "decode_payload",
    "decode_request",
    "encode_payload",
    "exact_request",
    "header_model",
    "payload_model",
    "payload_of",
    "payload_struct",
    "struct_of",
]
