"""A diverted topic's fetched records read into Faust's messages by the compiled reader.

aiokafka reads each fetched record through its Python ``PartitionRecords`` into a
``ConsumerRecord``, which Faust's ``_to_message`` copies into a ``ConsumerMessage``:
~3.5 µs a record, against ~1 µs for ``native.fetched_messages`` from the fetch's bytes
(8% of a null sink by py-spy; docs/performance.md, session 37). Installed by :func:`apply`:

1. aiokafka's fetcher wraps each partition's fetched bytes in ``MemoryRecords``;
   :class:`_KeptRecords` keeps the bytes as well.
2. Its ``PartitionRecords`` for a diverted topic's partition (``divert.divert``) is
   :class:`_Fetched`: the messages the compiled reader made, handed out as aiokafka's
   would be, each advancing the position (``next_fetch_offset``) as aiokafka's does.
   Where the reader declines (a codec, another format, a bad CRC) or is not built,
   aiokafka's ``PartitionRecords`` reads them, as for every other topic.
3. ``divert._getmany`` takes the messages as they are, stamped with the consumer's
   generation as ``_to_message`` stamps them.

tests/unit/test_fetched_messages.py holds the reader to aiokafka and Faust on generated
record sets; every integration test reads its diverted topics through it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import aiokafka.consumer.fetcher as fetcher
from aiokafka.record.memory_records import MemoryRecords
from faust.types.tuples import ConsumerMessage

from streams.native import native

__all__ = ["AiokafkaPartitionRecords", "apply"]


# aiokafka's, taken before ``apply`` installs the reading in its place.
AiokafkaPartitionRecords = fetcher.PartitionRecords


class _KeptRecords(MemoryRecords):  # type: ignore[misc]
    """aiokafka's record set over a fetch's bytes, which it keeps for the compiled reader."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        super().__init__(raw)
        self.raw = raw


class _Fetched:
    """What aiokafka's ``FetchResult`` asks of a ``PartitionRecords``: its records in turn,
    and the position after the last one taken (after the whole set once all are)."""

    __slots__ = ("_final", "_messages", "_taken", "next_fetch_offset")

    def __init__(self, messages: list[ConsumerMessage], final: int, fetch_offset: int) -> None:
        self._messages, self._final = messages, final
        self._taken = 0
        self.next_fetch_offset = fetch_offset

    def __iter__(self) -> _Fetched:
        return self

    def __next__(self) -> ConsumerMessage:
        taken = self._taken
        if taken == len(self._messages):
            self.next_fetch_offset = self._final
            raise StopIteration
        self._taken = taken + 1
        message = self._messages[taken]
        self.next_fetch_offset = message.offset + 1
        return message


def _reading(diverted: Callable[[str], bool]) -> Callable[..., Any]:
    """aiokafka's ``PartitionRecords`` for the fetcher, read compiled where ``diverted``."""

    def records_of(
        tp: Any,
        records: Any,
        aborted_transactions: Any,
        fetch_offset: int,
        key_deserializer: Any,
        value_deserializer: Any,
        check_crcs: bool,
        isolation_level: int,
    ) -> Any:
        if (
            native is not None
            and diverted(tp.topic)
            and isinstance(records, _KeptRecords)
            and type(records.raw) is bytes
            and key_deserializer is None
            and value_deserializer is None
            and isolation_level == fetcher.READ_UNCOMMITTED  # no aborted transactions to drop
        ):
            read = native.fetched_messages(
                records.raw, fetch_offset, tp, ConsumerMessage, check_crcs
            )
            if read is not None:
                messages, final = read
                return _Fetched(messages, final, fetch_offset)
        return AiokafkaPartitionRecords(
            tp,
            records,
            aborted_transactions,
            fetch_offset,
            key_deserializer,
            value_deserializer,
            check_crcs,
            isolation_level,
        )

    return records_of


def apply(diverted: Callable[[str], bool]) -> None:
    """Install steps 1 and 2 for the topics ``diverted`` says are (aiokafka 0.14's fetcher:
    the package's version guard)."""
    if native is None or fetcher.MemoryRecords is _KeptRecords:
        return
    fetcher.MemoryRecords = _KeptRecords  # type: ignore[misc]
    fetcher.PartitionRecords = _reading(diverted)  # type: ignore[misc]
