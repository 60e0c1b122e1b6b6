"""aiokafka's produce requests encoded with one copy of their batches
(``streams._faust.produce``): the bytes aiokafka's own ``encode`` writes, for every version
and any topics, partitions and batches (bytes, a bytearray, a memoryview, or none)."""

from __future__ import annotations

from typing import Any

from aiokafka.protocol.api import RequestStruct
from aiokafka.protocol.struct import Struct
from hypothesis import given, settings
from hypothesis import strategies as st

from streams._faust import produce
from streams._faust.app_base import FaustApp  # noqa: F401  (installs the encoding)

BATCH = st.one_of(
    st.binary(max_size=300),
    st.binary(max_size=300).map(bytearray),
    st.binary(max_size=300).map(memoryview),
    st.none(),
)
TOPICS = st.lists(
    st.tuples(
        st.text(max_size=12),
        st.lists(st.tuples(st.integers(0, 2**31 - 1), BATCH), max_size=4),
    ),
    max_size=4,
)


def _theirs(request: Any) -> bytes:
    return Struct.encode(request)  # type: ignore[no-any-return]


@settings(max_examples=300, deadline=None)
@given(
    version=st.sampled_from(produce._VERSIONS),
    topics=TOPICS,
    acks=st.sampled_from([-1, 0, 1]),
    timeout=st.integers(0, 2**31 - 1),
    transactional_id=st.one_of(st.none(), st.text(max_size=8)),
)
def test_a_produce_request_is_the_bytes_aiokafka_writes(
    version: type[RequestStruct], topics: Any, acks: int, timeout: int, transactional_id: Any
) -> None:
    fields = (acks, timeout, topics)
    if "transactional_id" in version.SCHEMA.names:
        fields = (transactional_id, *fields)
    request = version(*fields)
    assert request.encode() == _theirs(request)


def test_every_version_is_installed() -> None:
    assert len(produce._VERSIONS) >= 8  # v0-v7 in aiokafka 0.14
    assert all(version.encode is produce.encoded for version in produce._VERSIONS)
