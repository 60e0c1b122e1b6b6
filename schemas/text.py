"""Text that reaches a destination: control and bidirectional-override characters escaped.

Action text is untrusted. A NUL, BEL or ESC sequence, a DEL, or a right-to-left
override (U+202E) reaches an agent's context, a terminal or an Intercom note as
an invisible instruction to the renderer; here it becomes a visible escape
(``\\x1b``, ``\\u202e``), so what the agent reads is what the user typed.
``one_line`` also escapes newlines, so a field can never start a line of its own
(a description holding "\\n[99] click: ..." cannot pose as another action).
tests/unit/test_schemas.py::test_control_and_bidi_characters_are_escaped proves it.
"""

from __future__ import annotations

import re

__all__ = ["PII_PLACEHOLDER", "holds_any", "one_line", "one_line_each", "printable"]

# What the PII filter (agents/pii) puts where a value was: <KIND_tag>. Sinks count
# redactions with it without importing agents (tests/unit/test_pii.py).
PII_PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*_[a-z]{6}>")

_CONTROLS = [*range(0x20), 0x7F, *range(0x80, 0xA0)]
_BIDI_AND_SEPARATORS = [0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_BIDI_AND_SEPARATORS += [0x2028, 0x2029]  # line/paragraph separators some renderers break on

_PRINTABLE = {cp: f"\\x{cp:02x}" for cp in _CONTROLS if cp not in (0x09, 0x0A)}
_PRINTABLE.update({cp: f"\\u{cp:04x}" for cp in _BIDI_AND_SEPARATORS})
_ONE_LINE = {**_PRINTABLE, 0x0A: "\\n"}
# Searched first: ``translate`` with a dict looks up every character, 16 µs for an action's
# line against 1 µs for the search, and most text has nothing to escape (test_schemas).
_ANY_PRINTABLE = re.compile("[" + re.escape("".join(map(chr, _PRINTABLE))) + "]")
_ANY_ONE_LINE = re.compile("[" + re.escape("".join(map(chr, _ONE_LINE))) + "]")


def printable(text: str) -> str:
    """``text`` with control and bidi characters escaped; tabs and newlines kept."""
    return text.translate(_PRINTABLE) if _ANY_PRINTABLE.search(text) else text


def one_line(text: str) -> str:
    """:func:`printable`, with newlines escaped too: for one field of a one-line entry."""
    return text.translate(_ONE_LINE) if _ANY_ONE_LINE.search(text) else text


def one_line_each(lines: list[str]) -> str:
    """``lines`` joined by newlines, each escaped by :func:`one_line`. Whatever it escapes
    is not printable, so printable text (most of it) skips it: 2.1 against 3.7 µs a
    batch (scripts.bench.codecs; test_schemas.py::test_one_line_each)."""
    if "".join(lines).isprintable():
        return "\n".join(lines)
    return "\n".join(map(one_line, lines))


def holds_any(words: tuple[str, ...], text: str) -> bool:
    """Whether ``text`` holds one of ``words``: the gates that skip a search no match can be
    in (``schemas.ledger``, ``agents.pii.detectors``). A loop: any() over a generator costs
    more than these ``in`` checks."""
    for word in words:
        if word in text:
            return True
    return False
