"""An SDK-style sink module: just the SDK's two async callables, nothing of this project.

``AC_SINK=tests.support.sdk_style_sink`` loads it unchanged.
"""

from __future__ import annotations

from tests.support.sink_plugins import append_record


async def write_actions(session_id: str, text: str) -> None:
    append_record("sdk", {"call": "write_actions", "session_id": session_id, "text": text})


async def overwrite_with_summary(session_id: str, summary: str) -> None:
    append_record(
        "sdk", {"call": "overwrite_with_summary", "session_id": session_id, "text": summary}
    )
