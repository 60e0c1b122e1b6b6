"""Table declarations: raw-bytes values that each owner encodes compactly.

``use_partitioner=True`` puts each key's changelog record on the partition its
key hashes to, which is the session's partition in every topic (all topics are
keyed by session_id with the same partition count). That also lets timers and
per-session tasks, which run outside a stream event, write to tables.
"""

from __future__ import annotations

from typing import Any

import faust

from streams.app import ContextApp

__all__ = ["session_table"]


class _RawTable(faust.Table):
    """A table whose changelog holds the raw key and value bytes.

    Fix (found by tests/test_reliability.py): Faust derives a table's own
    changelog serializers from ``key_type``/``value_type`` only and ignores a
    ``schema=`` argument for writing, so these tables used to write the key as
    JSON (``"sid"`` with quotes) and read the value back through JSON as a dict.
    Two consequences: (1) every restart crashed the agents while recovering
    (``SessionState.from_bytes(dict)``), and (2) the quoted key hashed to a
    different partition than the session's raw key in the topics, so a worker
    owning a session's partition did not recover that session's state. Raw
    both ways keeps the key bytes identical to the topics' keys.
    """

    def _serializer_from_type(self, typ: Any) -> str:
        return "raw"


def session_table(app: ContextApp, name: str) -> faust.Table:
    table = _RawTable(
        app,
        name=name,
        default=None,
        beacon=app.tables.beacon,
        key_type=str,
        value_type=bytes,
        partitions=app.settings.partitions,
        use_partitioner=True,
    )
    return app.tables.add(table)  # type: ignore[return-value]
