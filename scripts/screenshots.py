"""Refresh docs/img/view-list.png and docs/img/view-session.png: the session view's
browser test (tests/integration/test_view.py) against a real pipeline, its screenshots kept.

    .venv/bin/python scripts/screenshots.py   # needs the broker `make test` uses
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    env = {**os.environ, "AC_VIEW_SCREENSHOTS": str(ROOT / "docs" / "img")}
    test = "tests/integration/test_view.py::test_browser_watches_a_session_live"
    sys.exit(subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test],
                             cwd=ROOT, env=env))  # fmt: skip
