"""The session view: a sink that serves its sessions live in a browser (``AC_SINK=view``)."""

from sinks.view.render import list_page_rows
from sinks.view.sink import SessionRow, ViewSettings, ViewSink

__all__ = ["SessionRow", "ViewSettings", "ViewSink", "list_page_rows"]
