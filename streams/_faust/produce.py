"""aiokafka's produce requests encoded with one copy of their record batches, not six.

aiokafka 0.14 encodes a request field by field, each ``Schema`` and ``Array`` joining its
parts' bytes, and ``Bytes`` prefixing a record batch by concatenation: a produce request's
batches are copied once per level (six times), each copy a new allocation, mapped afresh
for a large one. ``memmove`` was 7.8% of a pipeline worker by ``perf``, with page faults
and ``malloc`` beside it; a 384 KiB request took 297 µs to encode against 27 this way
(docs/performance.md, session 41). :func:`apply` gives each produce request version an
``encode`` that gathers the same parts into one list and joins them once: the same bytes
(tests/unit/test_produce_requests.py compares them with aiokafka's own on generated
requests, every version).
"""

from __future__ import annotations

from typing import Any

from aiokafka.protocol import produce
from aiokafka.protocol.types import Array, Bytes, Int32, Schema

__all__ = ["apply", "encoded"]

_VERSIONS = tuple(
    getattr(produce, f"ProduceRequest_v{n}")
    for n in range(9)
    if hasattr(produce, f"ProduceRequest_v{n}")
)


def _parts(schema: Schema, values: Any, out: list[Any]) -> None:
    """``schema.encode(values)``'s pieces in order, a ``Bytes`` value as it is. Only these
    exact types are taken apart (``CompactArray`` is an ``Array`` with another prefix);
    every other field writes itself."""
    for field, value in zip(schema.fields, values, strict=True):
        kind = type(field)
        if kind is Schema:
            _parts(field, value, out)
        elif kind is Array and value is not None:
            out.append(Int32.encode(len(value)))
            inner = field.array_of
            if type(inner) is Schema:
                for item in value:
                    _parts(inner, item, out)
            else:
                out.extend(inner.encode(item) for item in value)
        elif field is Bytes and value is not None:
            out.append(Int32.encode(len(value)))
            out.append(value)
        else:
            out.append(field.encode(value))


def encoded(request: Any) -> bytes:
    """A request struct's bytes, as its own ``encode`` writes them, joined once."""
    out: list[Any] = []
    schema = request.SCHEMA
    _parts(schema, [request.__dict__[name] for name in schema.names], out)
    return b"".join(out)


def apply() -> None:
    """Install :func:`encoded` as every produce request version's ``encode`` (aiokafka
    0.14: the package's version guard)."""
    for version in _VERSIONS:
        version.encode = encoded
