"""The session view: a sink that keeps what a browser needs to watch sessions live.

``AC_SINK=view`` (its own consumer group, like every sink). Per session it keeps,
in ``context.extra["view"]`` (saved with the context, so a restart forgets
nothing), who the session is (user, email, product), when it last acted, and a
bounded timeline of its operations. In memory it keeps an index of the sessions
this worker holds (one row each, bounded) for the list page, rebuilt from the
table after a restart, and a change counter that wakes the pages' event streams.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas import ActionsWritten, SummaryReady
from schemas.text import PII_PLACEHOLDER as PLACEHOLDER
from sinks.base import Operation
from sinks.context import SessionContext
from streams.settings import Settings

__all__ = ["SessionRow", "ViewSettings", "ViewSink"]

BOOK = "view"  # the key of this sink's bookkeeping in context.extra


def redactions(text: str) -> dict[str, int]:
    """The PII filter's placeholders in ``text`` (``AC_PII=llm,destinations``), by kind."""
    found: dict[str, int] = {}
    for match in PLACEHOLDER.finditer(text):
        kind = match.group()[1:].rsplit("_", 1)[0]
        found[kind] = found.get(kind, 0) + 1
    return found


class ViewSettings(BaseSettings):
    """``AC_VIEW_*``."""

    model_config = SettingsConfigDict(env_prefix="AC_VIEW_", extra="ignore")

    max_sessions: int = Field(default=100_000, ge=1)  # rows in the list's index
    timeline: int = Field(default=200, ge=1)  # operations kept per session
    timeline_page: int = Field(default=50, ge=1, le=500)  # operations per timeline page
    page_size: int = Field(default=50, ge=1, le=500)  # sessions per list page
    # Other workers' web addresses (comma-separated) for the operator strip's figures.
    metrics_urls: str = ""

    @property
    def metrics_url_list(self) -> list[str]:
        return [u.strip() for u in self.metrics_urls.split(",") if u.strip()]


@dataclass
class SessionRow:
    """One session in the list."""

    session_id: str
    product_id: str = ""
    user_id: str = ""
    email: str = ""
    actions: int = 0  # actions this visit
    summaries: int = 0
    generation: int = 0
    closed: bool = False
    last_activity: float = 0.0

    def matches(self, query: str) -> bool:
        query = query.casefold()
        return any(
            query in v.casefold()
            for v in (self.session_id, self.user_id, self.email, self.product_id)
        )


def row_from(context: SessionContext) -> SessionRow:
    book: dict[str, Any] = context.extra.get(BOOK) or {}
    return SessionRow(
        session_id=context.session_id,
        product_id=book.get("product_id", ""),
        user_id=book.get("user_id", ""),
        email=book.get("email", ""),
        actions=context.actions_to,
        summaries=context.summaries,
        generation=context.generation,
        closed=context.closed,
        last_activity=book.get("last_activity", 0.0),
    )


class ViewSink:
    name = "view"
    inline = True  # apply keeps rows in memory: no task and no commit per operation

    def __init__(self, settings: ViewSettings | None = None) -> None:
        self.settings = settings or ViewSettings()
        self.rows: OrderedDict[str, SessionRow] = OrderedDict()  # least recently active first
        self.versions: dict[str, int] = {}  # per session, bumped on every change
        self.version = 0
        self._changed = asyncio.Event()
        # The consumer group generation whose table the rows were rebuilt from.
        self.indexed: int | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ViewSink:
        return cls(ViewSettings())

    def add_routes(self, app: Any, contexts: Any, load: Any) -> None:
        from sinks.view.routes import add_routes

        add_routes(app, contexts, load, self)

    # ------------------------------------------------------------------ changes

    def _touch(self, session_id: str) -> None:
        self.version += 1
        self.versions[session_id] = self.versions.get(session_id, 0) + 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()  # wakes every stream waiting on this version

    def next_change(self) -> asyncio.Event:
        """Set at the next change: taken *before* reading the state, so that a change
        while a stream renders or writes is never missed."""
        return self._changed

    @staticmethod
    async def wait(change: asyncio.Event, timeout: float) -> None:
        """Return once ``change`` is set, or after ``timeout`` seconds."""
        try:
            await asyncio.wait_for(change.wait(), timeout)
        except TimeoutError:
            pass

    def index(self, row: SessionRow) -> None:
        self.rows.pop(row.session_id, None)
        self.rows[row.session_id] = row
        while len(self.rows) > self.settings.max_sessions:
            self.rows.popitem(last=False)

    # ------------------------------------------------------------------ operations

    async def apply(self, op: Operation, context: SessionContext) -> None:
        book: dict[str, Any] = context.extra.setdefault(BOOK, {})
        if op.product_id:
            book["product_id"] = op.product_id
        now = time.time()
        entry: dict[str, Any] = {
            "at": op.emitted_at or now,
            "applied": now,
            "generation": op.generation,
            "from": op.seq_from,
            "to": op.seq_to,
        }
        if isinstance(op, ActionsWritten):
            payload = op.payload
            if payload.user_id:
                book["user_id"] = payload.user_id
            if payload.email:
                book["email"] = payload.email
            entry["kind"] = "batch"
            entry["actions"] = len(payload.actions)
            text = op.text
        else:
            assert isinstance(op, SummaryReady)
            entry["kind"] = "final summary" if op.final else "summary"
            entry["window_from"] = op.window_from
            entry["chars"] = len(op.summary)
            entry["took_s"] = op.summarized_in_s
            if op.usage is not None:
                entry["model"] = op.usage.model
                entry["tokens"] = op.usage.prompt_tokens + op.usage.completion_tokens
            text = op.summary
        if redacted := redactions(text):
            entry["redacted"] = redacted
        book["last_activity"] = now
        timeline: list[dict[str, Any]] = book.setdefault("timeline", [])
        timeline.append(entry)
        del timeline[: -self.settings.timeline]
        self.index(row_from(context))
        self._touch(op.session_id)

    async def erase(self, session_id: str, context: SessionContext) -> None:
        self.rows.pop(session_id, None)
        self._touch(session_id)
