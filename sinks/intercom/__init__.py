"""The Intercom sink: each batch an internal admin note; each summary a note that replaces them."""

from sinks.intercom.api import IntercomAPI
from sinks.intercom.notes import NoteMarker, html_to_text, note_body, parse_note, session_ref
from sinks.intercom.settings import IntercomSettings
from sinks.intercom.sink import IntercomSink

__all__ = [
    "IntercomAPI",
    "IntercomSettings",
    "IntercomSink",
    "NoteMarker",
    "html_to_text",
    "note_body",
    "parse_note",
    "session_ref",
]
