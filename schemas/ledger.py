"""The session ledger: hard facts about a session, counted from every action, no LLM.

A summary is a model's paraphrase and can drop or garble facts; the ledger
cannot. The summarize stage counts every batch of each request it takes into it
(:func:`count_batches`, O(1) per action, bounded bytes;
``agents.summarize.state.count_facts``), it travels with every summary, and every
sink shows it beside the summary (:meth:`SessionLedger.render`).

Bounded by construction: ``pages`` keeps at most ``top_pages`` pages (a new
page takes the place of the least visited one, whose actions move to
``other_page_actions``, so the page counts always add up to ``actions``; they
are exact while a session has visited at most ``top_pages`` distinct pages),
``errors`` and ``key_actions`` keep the latest few with their totals, and every
text is cut to ``ENTRY_MAX_CHARS``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import msgspec
from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

from schemas.actions import SlimAction
from schemas.text import holds_any, one_line

__all__ = [
    "DEFAULT_ERROR_PATTERN",
    "DEFAULT_KEY_PATTERN",
    "ENTRY_MAX_CHARS",
    "LedgerEntry",
    "LedgerLimits",
    "SessionLedger",
    "count_batches",
    "new_ledger",
]

ENTRY_MAX_CHARS = 120
KINDS_REMEMBERED = 4096  # texts whose kinds LedgerLimits.kinds keeps
# Matched against "type: title description". Defaults: form submits, errors,
# button clicks and the actions support agents ask about (upgrades, exports, ...).
DEFAULT_KEY_PATTERN = (
    r"(?i)^(submit|form_submit|error)\b"
    r"|\b(button|submit(ted)?|error|failed|upgrade|purchase|checkout|cancel(led)?|delete[d]?"
    r"|export|invite[d]?|connect)\b"
)
DEFAULT_ERROR_PATTERN = r"(?i)^error\b|\b(error|failed|exception)\b"
# What every match of a default pattern holds, lower case: an ASCII text (where lower() folds
# as (?i) does) holding none of them skips the search, 1.2 against 9-13 µs on a unique line
# of 70-90 characters (tests/unit/test_ledger.py::test_the_default_patterns_gates_are_exact).
_GATE_WORDS = {
    DEFAULT_KEY_PATTERN: (
        *("submit", "error", "button", "failed", "upgrade", "purchase", "checkout", "cancel"),
        *("delete", "export", "invite", "connect"),
    ),
    DEFAULT_ERROR_PATTERN: ("error", "failed", "exception"),
}


@dataclass(frozen=True)
class LedgerLimits:
    """How much of a session the ledger keeps (settings ``AC_LEDGER_*``)."""

    top_pages: int = 10
    key_actions: int = 8
    errors: int = 5
    key_pattern: str = DEFAULT_KEY_PATTERN
    error_pattern: str = DEFAULT_ERROR_PATTERN

    def __post_init__(self) -> None:
        # Compiled once per Limits (re caches too, but a lookup per action is measurable).
        object.__setattr__(self, "_key", re.compile(self.key_pattern))
        object.__setattr__(self, "_error", re.compile(self.error_pattern))
        object.__setattr__(self, "_key_words", _GATE_WORDS.get(self.key_pattern))
        object.__setattr__(self, "_error_words", _GATE_WORDS.get(self.error_pattern))
        object.__setattr__(self, "_kinds", {})

    @property
    def default_patterns(self) -> bool:
        """Both patterns the defaults, which the compiled facts of a request
        (``agents.summarize.compiled.RequestFacts``) match as ``re`` does on ASCII text."""
        return self.key_pattern == DEFAULT_KEY_PATTERN and (
            self.error_pattern == DEFAULT_ERROR_PATTERN
        )

    def is_key(self, text: str) -> bool:
        return self._key.search(text) is not None  # type: ignore[attr-defined,no-any-return]

    def is_error(self, text: str) -> bool:
        return self._error.search(text) is not None  # type: ignore[attr-defined,no-any-return]

    def kinds(self, text: str) -> tuple[bool, bool]:
        """(``is_error``, ``is_key``), remembered: a product's actions repeat their texts, and
        the two searches were a third of the ledger's cost (scripts/bench, --profile)."""
        kinds: dict[str, tuple[bool, bool]] = self._kinds  # type: ignore[attr-defined]
        found = kinds.get(text)
        if found is None:
            if len(kinds) >= KINDS_REMEMBERED:
                kinds.clear()
            low = text.lower() if text.isascii() else None
            found = kinds[text] = (
                _search(self._error, self._error_words, text, low),  # type: ignore[attr-defined]
                _search(self._key, self._key_words, text, low),  # type: ignore[attr-defined]
            )
        return found


def _search(
    pattern: re.Pattern[str], words: tuple[str, ...] | None, text: str, low: str | None
) -> bool:
    """``pattern.search(text)``, skipped when ``low`` (``text`` lower-cased, ASCII only)
    holds none of the ``words`` that each of its matches holds."""
    if words is not None and low is not None and not holds_any(words, low):
        return False
    return pattern.search(text) is not None


class LedgerEntry(msgspec.Struct, kw_only=True, frozen=True, forbid_unknown_fields=True):
    seq: int
    text: str


class SessionLedger(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The wire and pull-view form (the summarize stage keeps the same shape as a dict).

    A msgspec Struct, not a pydantic model: a sink builds one per summary, and the
    model's entries cost 23 of a summary operation's 32 µs (docs/decisions.md). It
    refuses unknown fields (msgspec would skip them unchecked), so what it takes from
    bytes the models take too; the message models embed it by
    :meth:`__get_pydantic_core_schema__`, which drops unknown fields, as the pydantic
    model did (tests/unit/test_fast_decode.py)."""

    actions: int = 0
    batches: int = 0
    first_at: float = 0.0  # the first action's time (its timestamp, else its arrival)
    last_at: float = 0.0
    pages: dict[str, int] = msgspec.field(default_factory=dict)  # the most visited, counts
    other_page_actions: int = 0  # actions on pages not in ``pages``
    errors: list[LedgerEntry] = msgspec.field(default_factory=list)  # the latest
    errors_total: int = 0
    key_actions: list[LedgerEntry] = msgspec.field(default_factory=list)  # the latest
    key_actions_total: int = 0
    first_step: LedgerEntry | None = None
    last_step: LedgerEntry | None = None

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: Any, handler: GetCoreSchemaHandler
    ) -> core_schema.CoreSchema:
        """A field of a pydantic model: validated by msgspec (a ledger or its JSON form,
        a one-line reason naming where it is wrong), dumped as its JSON form."""
        return core_schema.no_info_plain_validator_function(
            _validated,
            serialization=core_schema.plain_serializer_function_ser_schema(msgspec.to_builtins),
            json_schema_input_schema=core_schema.dict_schema(),
        )

    def render(self) -> str:
        """The compact block an agent reads after the summary."""
        noun = "action" if self.actions == 1 else "actions"
        batches = "batch" if self.batches == 1 else "batches"
        lines = [
            "Session facts (counted from every action, not written by the model):",
            f"- {self.actions} {noun} in {self.batches} {batches}"
            + _span(self.first_at, self.last_at),
        ]
        if self.pages:
            ranked = sorted(self.pages.items(), key=lambda kv: -kv[1])
            pages = ", ".join(f"{page} ({count})" for page, count in ranked)
            other = f"; {self.other_page_actions} on other pages" if self.other_page_actions else ""
            lines.append(f"- Pages (actions): {pages}{other}")
        for label, entries, total in (
            ("Errors", self.errors, self.errors_total),
            ("Key actions", self.key_actions, self.key_actions_total),
        ):
            if total:
                latest = "; ".join(f"[{e.seq}] {e.text}" for e in entries)
                shown = f", the latest {len(entries)}" if total > len(entries) else ""
                lines.append(f"- {label} ({total}{shown}): {latest}")
        if self.first_step is not None:
            lines.append(f"- First step: [{self.first_step.seq}] {self.first_step.text}")
        if self.last_step is not None:
            lines.append(f"- Last step: [{self.last_step.seq}] {self.last_step.text}")
        return "\n".join(lines)


def _span(first: float, last: float) -> str:
    if first <= 0 or last <= 0:
        return ""
    start = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(first))
    end = time.strftime("%H:%M:%S", time.gmtime(last))
    seconds = max(int(last - first), 0)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    length = f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s"
    return f", {start} to {end} UTC ({length})"


def _known(value: Any, fields: tuple[str, ...]) -> Any:
    return {k: v for k, v in value.items() if k in fields} if isinstance(value, dict) else value


def _validated(value: Any) -> SessionLedger:
    """A ledger, or its JSON form with unknown fields dropped (a later version's, as the
    pydantic model dropped them: only msgspec's exact path refuses them)."""
    if isinstance(value, SessionLedger):
        return value
    entry = LedgerEntry.__struct_fields__
    value = _known(value, SessionLedger.__struct_fields__)
    if isinstance(value, dict):
        for name in ("errors", "key_actions"):
            if isinstance(entries := value.get(name), list):
                value[name] = [_known(e, entry) for e in entries]
        for name in ("first_step", "last_step"):
            if name in value:
                value[name] = _known(value[name], entry)
    try:
        return msgspec.convert(value, SessionLedger, strict=False)
    except msgspec.ValidationError as exc:  # "Expected `int`, got `str` - at `$.pages.p`"
        reason, _, where = str(exc).partition(" - at `$")
        path = where.rstrip("`").lstrip(".")
        raise PydanticCustomError(
            "ledger", "{reason}", {"reason": f"{path}: {reason}" if path else reason}
        ) from None


def new_ledger() -> dict[str, Any]:
    return msgspec.to_builtins(SessionLedger())  # type: ignore[no-any-return]


def _entry(seq: int, action: SlimAction) -> dict[str, Any]:
    return {"seq": seq, "text": _entry_text(action.type, action.description or action.title)}


# Remembered, as LedgerLimits.kinds: a product's actions repeat their texts and pages.
@lru_cache(maxsize=KINDS_REMEMBERED)
def _entry_text(kind: str, what: str) -> str:
    text = one_line(f"{kind or 'action'}: {what}")
    if len(text) > ENTRY_MAX_CHARS:
        text = text[: ENTRY_MAX_CHARS - 1] + "…"
    return text


@lru_cache(maxsize=KINDS_REMEMBERED)
def _page(url: str) -> str:
    return one_line(url or "(unknown page)")


def _keep_last(entries: list[dict[str, Any]], keep: int) -> None:
    if len(entries) > keep:
        del entries[: len(entries) - keep]


def count_batches(
    ledger: dict[str, Any],
    batches: Iterable[tuple[Sequence[SlimAction], float]],
    seq_from: int,
    limits: LedgerLimits,
) -> None:
    """Count consecutive batches (their actions, and the time their undated actions count
    at), numbered on from ``seq_from``, into ``ledger`` (in place): a summarize request's.

    Totals and bounds are applied once, and an entry is built only for an error or key
    action the bounds keep: the same ledger as counting action by action
    (tests/unit/test_ledger.py, against the per-action oracle) at a fraction of the cost."""
    pages: dict[str, int] = ledger["pages"]
    first_at, last_at, first_step = ledger["first_at"], ledger["last_at"], ledger["first_step"]
    kinds, top_pages = limits.kinds, limits.top_pages
    errors: list[tuple[int, Any]] = []  # (seq, action)
    key_actions: list[tuple[int, Any]] = []
    seq, counted, last = seq_from, 0, None
    for actions, now in batches:
        if not actions:
            continue
        counted += 1
        for number, action in enumerate(actions, seq):
            start, end = action.timestamp_start, action.timestamp_end
            if not first_at:
                first_at = start or end or now
            last_at = max(last_at, end or start or now)
            page = _page(action.canonical_url or action.raw_url)
            if page in pages:
                pages[page] += 1
            else:
                if len(pages) >= top_pages:
                    # Full: the least visited page (the earliest among ties) makes room, its
                    # actions move to ``other_page_actions`` so the counts still add up.
                    least = min(pages, key=pages.__getitem__)
                    ledger["other_page_actions"] += pages.pop(least)
                pages[page] = 1
            if first_step is None:
                first_step = ledger["first_step"] = _entry(number, action)
            is_error, is_key = kinds(f"{action.type}: {action.title} {action.description}")
            if is_error:
                errors.append((number, action))
            if is_key:
                key_actions.append((number, action))
        last, seq = (number, actions[-1]), number + 1
    if last is None:
        return
    ledger["batches"] += counted
    ledger["actions"] += seq - seq_from
    ledger["first_at"], ledger["last_at"] = first_at, last_at
    for name, found, keep in (
        ("errors", errors, limits.errors),
        ("key_actions", key_actions, limits.key_actions),
    ):
        ledger[f"{name}_total"] += len(found)
        entries = ledger[name]
        entries += [_entry(s, a) for s, a in found[max(len(found) - keep, 0) :]]
        _keep_last(entries, keep)
    ledger["last_step"] = _entry(*last)
