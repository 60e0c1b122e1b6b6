"""Table declarations: raw-bytes values that each owner encodes compactly.

``use_partitioner=True`` puts each key's changelog record on the partition its
key hashes to, which is the session's partition in every topic (all topics are
keyed by session_id with the same partition count). That also lets timers and
per-session tasks, which run outside a stream event, write to tables.
"""

from __future__ import annotations

import faust
from faust.types import TableT

from streams.app import ContextApp

__all__ = ["session_table"]


def session_table(app: ContextApp, name: str) -> TableT[str, bytes]:
    return app.Table(
        name,
        default=None,
        schema=faust.Schema(
            key_type=str, value_type=bytes, key_serializer="raw", value_serializer="raw"
        ),
        partitions=app.settings.partitions,
        use_partitioner=True,
    )
