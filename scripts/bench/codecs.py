"""Decoding a context operation: pydantic, the sink's ``decode_context_message`` (msgspec,
then the models built) and msgspec alone, whole or header only;
and an input payload as the accumulator takes it (a Struct, no model built), against the
model built and serialised as before, and the Struct alone.

    python -m scripts.bench.codecs

The sink validates every operation with pydantic; msgspec Structs of the same fields
are the candidate for the internal hot-path messages (docs/performance.md).
"""

from __future__ import annotations

import time
import timeit
from typing import Any

import msgspec
import orjson

from schemas import (
    ActionsPayload,
    ActionsWritten,
    SummaryReady,
    context_message_adapter,
    encode,
)
from schemas.actions import numbered_text
from schemas.fast import (
    Payload,
    decode_context_message,
    decode_payload,
    encode_payload,
    payload_of,
    struct_of,
)
from schemas.fast.structs import ExactPayload
from scripts.bench.workload import workload


class Header(msgspec.Struct):
    op: str
    session_id: str
    seq_from: int
    seq_to: int
    generation: int = 0


def records() -> list[bytes]:
    """``actions_written`` operations as the pipeline emits them, for the workload's payloads."""
    payloads = workload(3000, 100, 1, min_batch=1, max_batch=3)
    out = []
    for raw in payloads:
        p = ActionsPayload.model_validate(raw)
        op = ActionsWritten(
            seq_from=1,
            seq_to=len(p.actions),
            session_id=p.session_id,
            text=p.numbered_text(1),
            payload=p,
            emitted_at=time.time(),
        )
        out.append(encode(op))
    return out


def main() -> None:
    raws = records()
    written = struct_of(ActionsWritten, "Written", "actions_written", payload=Payload)
    summary = struct_of(SummaryReady, "Summary", "summary_ready", ledger=Any, usage=Any)
    full = msgspec.json.Decoder(written | summary)
    head = msgspec.json.Decoder(Header)
    assert full.decode(raws[0]).session_id == orjson.loads(raws[0])["session_id"]
    cases = {
        "decode_context_message (a sink that reads the payload)": decode_context_message,
        "decode_context_message, payload=False (reads_payload = False)": lambda r: (
            decode_context_message(r, payload=False)
        ),
        "pydantic: orjson.loads + validate_python": lambda r: (
            context_message_adapter.validate_python(orjson.loads(r))
        ),
        "pydantic: validate_json": context_message_adapter.validate_json,
        "msgspec: the whole operation (Structs)": full.decode,
        "msgspec: the header only (op, session, seq range, generation)": head.decode,
        "orjson.loads alone (no validation)": orjson.loads,
    }
    print(f"{len(raws)} actions_written records, {sum(map(len, raws)) / len(raws):.0f} bytes each")
    _time(cases, raws, "record")
    _input_payloads()


def _time(cases: dict[str, Any], raws: list[bytes], unit: str) -> None:
    for name, decode in cases.items():
        runs = timeit.repeat(lambda d=decode: [d(r) for r in raws], number=3, repeat=5)
        print(f"  {name:<62} {min(runs) / 3 / len(raws) * 1e6:6.2f} us per {unit}")


def _input_payloads() -> None:
    """What the accumulator does with a payload before its own work: the Struct decoded,
    encoded for the stored batch and rendered; until session 19 the pydantic model was
    built (``payload_of``) and serialised."""
    raws = [orjson.dumps(p) for p in workload(3000, 100, 1, min_batch=1, max_batch=3)]
    encoder, decoder = msgspec.json.Encoder(), msgspec.json.Decoder(ExactPayload)

    def now(raw: bytes) -> Any:
        p = decode_payload(raw)
        return encode_payload(p), numbered_text(p.session_id, p.actions, 1)

    def model(raw: bytes) -> Any:
        payload = payload_of(decode_payload(raw))
        return payload.__pydantic_serializer__.to_json(payload), payload.numbered_text(1)

    cases = {
        "decode_payload, encode_payload, numbered_text (the accumulator)": now,
        "the same with the model built and serialised (before)": model,
        "decode_payload alone (the Struct)": decode_payload,
        "the Struct decoded and encoded again (no model)": lambda r: encoder.encode(
            decoder.decode(r)
        ),
    }
    actions = sum(len(orjson.loads(r)["actions"]) for r in raws)
    print(f"{len(raws)} input payloads, {actions / len(raws):.1f} actions each")
    _time(cases, raws, "payload")


if __name__ == "__main__":
    main()
