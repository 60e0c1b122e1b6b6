"""The ``agent-context`` command line: produce, inspect and repair a deployment from a shell.

    agent-context produce-sample --sessions 50 --mean-length 40
    agent-context produce-file payloads.jsonl
    agent-context context SESSION_ID --url http://127.0.0.1:6067
    agent-context search "exported a CSV" --product-id prod_demo --url http://127.0.0.1:6068
    agent-context search "how do I export?" --session SESSION_ID  (the enriched query)
    agent-context tail --session SESSION_ID
    agent-context dead-letters list --limit 20
    agent-context dead-letters redrive --dry-run
    agent-context dead-letters redrive --stage sink-intercom
    agent-context link SESSION_ID CONVERSATION_ID
    agent-context ingest --port 8080      (the connector's webhooks; AC_INGEST_*)
    agent-context sse-bridge              (a connector's SSE stream; AC_SSE_*)

Every command reads the service's settings from the environment (``AC_*``, see
``streams.settings``) and accepts ``--bootstrap`` to point at another broker.
Also runnable as ``python -m agents.cli``.

Exit codes: 0 done; 1 an error (unreachable broker or sink worker, missing
topic, unreadable file), reported in one line without a traceback; 2 wrong
usage; 3 ``produce-file`` found invalid records (they were dead-lettered, the
valid ones were produced).
"""

from __future__ import annotations

from agents.cli import dead_letters, ingest, produce, read
from agents.cli.common import app
from streams.errors import stop_on_configuration_error

__all__ = ["app", "main"]

COMMAND_GROUPS = (produce, read, dead_letters)  # importing them registers their commands
# The long-running servers last: --help lists commands in the order they were added.
app.command()(ingest.ingest)
app.command("sse-bridge")(ingest.sse_bridge)


@stop_on_configuration_error()  # a bad setting is one line, not a traceback
def main() -> None:
    app(prog_name="agent-context")
