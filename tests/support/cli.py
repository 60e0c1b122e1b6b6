"""Run ``agent-context`` as a user would: ``python -m agents.cli`` in a subprocess."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

from tests.support.workers import ROOT


def cli_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "agents.cli", *args]


async def cli(
    env: dict[str, str], *args: str, stdin: bytes | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a command with ``env`` over this process's environment; never a traceback."""
    done = await asyncio.to_thread(
        subprocess.run,
        cli_command(*args),
        cwd=ROOT,
        env={**os.environ, **env},
        input=stdin.decode() if stdin is not None else None,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done
