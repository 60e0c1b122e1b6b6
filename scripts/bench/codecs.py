"""Decoding a context operation: pydantic (today) against msgspec, whole or header only.

    python -m scripts.bench.codecs        (msgspec: the bench extra)

The sink validates every operation with pydantic; msgspec Structs of the same fields
are the candidate for the internal hot-path messages (docs/performance.md).
"""

from __future__ import annotations

import time
import timeit

import msgspec
import orjson

from schemas import ActionsPayload, ActionsWritten, context_message_adapter, encode
from scripts.bench.workload import workload


class Action(msgspec.Struct, forbid_unknown_fields=False):
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


class Payload(msgspec.Struct):
    session_id: str
    product_id: str = ""
    user_id: str | None = None
    email: str | None = None
    actions: list[Action] = []
    count: int = 0
    forwarded_at: float = 0.0
    conversation_id: str | None = None


class Written(msgspec.Struct, tag_field="op", tag="actions_written"):
    seq_from: int
    seq_to: int
    session_id: str
    text: str
    payload: Payload
    emitted_at: float
    generation: int = 0
    product_id: str = ""
    conversation_id: str | None = None
    ingested_at: float = 0.0


class Summary(msgspec.Struct, tag_field="op", tag="summary_ready"):
    seq_from: int
    seq_to: int
    session_id: str
    summary: str
    window_from: int
    emitted_at: float


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
    full = msgspec.json.Decoder(Written | Summary)
    head = msgspec.json.Decoder(Header)
    assert full.decode(raws[0]).session_id == orjson.loads(raws[0])["session_id"]
    cases = {
        "pydantic: orjson.loads + validate_python (today)": lambda r: (
            context_message_adapter.validate_python(orjson.loads(r))
        ),
        "pydantic: validate_json": context_message_adapter.validate_json,
        "msgspec: the whole operation (Structs)": full.decode,
        "msgspec: the header only (op, session, seq range, generation)": head.decode,
        "orjson.loads alone (no validation)": orjson.loads,
    }
    print(f"{len(raws)} actions_written records, {sum(map(len, raws)) / len(raws):.0f} bytes each")
    for name, decode in cases.items():
        runs = timeit.repeat(lambda d=decode: [d(r) for r in raws], number=3, repeat=5)
        print(f"  {name:<62} {min(runs) / 3 / len(raws) * 1e6:6.2f} us per record")


if __name__ == "__main__":
    main()
