"""The demo's closing report: each session's context as the sink recorded it, and
the text an agent reads for a closed session and for one still going."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from schemas import ActionsPayload

console = Console()

_STATED = re.compile(r"(\d+) actions? so far")


def show_results(
    contexts: dict[str, Any],
    payloads: list[dict[str, Any]],
    run_dir: Path,
    k: int,
    live: dict[str, Any],
) -> None:
    raw_chars: dict[str, int] = {}
    counts: dict[str, int] = {}
    for p in [*payloads, *live["payloads"]]:
        sid = str(p["session_id"])
        raw_chars[sid] = raw_chars.get(sid, 0) + len(ActionsPayload.model_validate(p).to_text())
        counts[sid] = counts.get(sid, 0) + len(p["actions"])
    table = Table(
        title="Per-session context at the destination (files sink), as the sink worker recorded it",
        caption="sums: summaries taken · covers: the range the summary replaced · states: the "
        "action count the summary itself states · after: raw actions after the summary · "
        "chars: the characters an agent reads · "
        "state: closed (idle, final summary applied) or open",
    )
    columns = ("session", "actions", "sums", "covers", "states", "after")
    for column in (*columns, "chars", "state"):
        table.add_column(column, justify="left" if column == "session" else "right", no_wrap=True)
    whole = 0
    for sid, context in sorted(contexts.items()):
        stated = _STATED.search(context["summary"] or "")
        covers = context["summary_covers"]
        raw_after = sum(b["seq_to"] - b["seq_from"] + 1 for b in context["actions"])
        complete = bool(covers and stated and int(stated.group(1)) == covers[1])
        whole += complete and covers[1] + raw_after == counts[sid]
        table.add_row(
            sid,
            str(counts[sid]),
            str(context["summaries"]),
            f"1-{covers[1]}" if covers else "-",
            (stated.group(1) if stated else "-") + ("" if complete else " (!)"),
            str(raw_after),
            str(len(context["text"])),
            "closed" if context["closed"] else "open",
        )
    console.print(table)
    total_context = sum(len(c["text"]) for c in contexts.values())
    closed = sum(1 for c in contexts.values() if c["closed"])
    console.print(
        f"{len(contexts)} sessions ({closed} closed, {len(contexts) - closed} open) · "
        f"{sum(counts.values())} actions · "
        f"{sum(c['summaries'] for c in contexts.values())} summaries · "
        f"{whole} of {len(contexts)} sessions' contexts account for every action "
        "(the summary states the count it covers, the raw actions after it are the rest) · "
        f"context kept {total_context} chars where the raw actions are "
        f"{sum(raw_chars.values())} chars "
        f"({total_context / max(sum(raw_chars.values()), 1):.0%})."
    )
    finished = [s for s in contexts if contexts[s]["closed"]]
    longest = max(finished, key=lambda s: counts[s])
    console.print(
        Panel(
            contexts[longest]["text"].strip(),
            title=f"{longest} (closed): its final summary covers all {counts[longest]} actions",
        )
    )
    sid = live["session_id"]
    console.print(
        Panel(
            contexts[sid]["text"].strip(),
            title=f"{sid} (open): summary of 1-{contexts[sid]['summary_covers'][1]}, "
            "raw actions after it",
        )
    )
    files_dir = run_dir / "context"
    console.print(f"Context files (one per session): {files_dir}")
    console.print(f"Worker logs: {run_dir}/pipeline.log, {run_dir}/sink-files.log")
    console.print("The broker keeps running for the next run; stop it with: make stop")
