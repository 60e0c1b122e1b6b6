"""Files sink: one file per session holding its current context, rewritten atomically."""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import tempfile
from pathlib import Path

from sinks.base import Operation, Sink
from sinks.context import SessionContext
from streams.settings import Settings

__all__ = ["FilesSink", "context_file"]

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def context_file(directory: Path, session_id: str) -> Path:
    """A file name no session id can escape from (``../``, ``/``, NUL...)."""
    safe = _UNSAFE.sub("_", session_id)[:100]
    if safe != session_id or safe in {".", ".."}:
        safe = f"{safe}-{hashlib.sha256(session_id.encode()).hexdigest()[:12]}"
    return directory / f"{safe}.txt"


def _write_atomically(path: Path, text: str) -> None:
    # A reader sees the old file or the new one, never a half-written one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class FilesSink(Sink):
    name = "files"
    reads_payload = False  # it writes the context's text

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> FilesSink:
        return cls(settings.files_dir)

    async def erase(self, session_id: str, context: SessionContext) -> None:
        await asyncio.to_thread(context_file(self.directory, session_id).unlink, missing_ok=True)

    async def apply(self, op: Operation, context: SessionContext) -> None:
        path = context_file(self.directory, context.session_id)
        await asyncio.to_thread(_write_atomically, path, context.render())
