"""``python -m agents.cli``: the same as ``agent-context``."""

from agents.cli import main

main()
