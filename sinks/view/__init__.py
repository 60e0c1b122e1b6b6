"""The session view: sessions and what their agent reads, live in a browser
(``AC_SINK=view``, ``/ui/`` on its web port; docs/sinks.md#view)."""

from sinks.view.routes import list_page_rows
from sinks.view.sink import SessionRow, ViewSettings, ViewSink

__all__ = ["SessionRow", "ViewSettings", "ViewSink", "list_page_rows"]
