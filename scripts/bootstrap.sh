#!/usr/bin/env bash
# Creates the project's virtual environment and installs it with its test
# tools. Safe to run again: it reinstalls only when pyproject.toml changed.
# The top-level packages have generic names (agents, streams, ...), so they are
# installed into this project's own .venv, never into a shared interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}

if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv with $($python --version)"
  "$python" -m venv .venv
fi
stamp=".venv/.installed-$(sha256sum pyproject.toml | cut -c1-16)"
if [[ ! -f $stamp ]]; then
  echo "[setup] installing the project and its test tools into .venv (about a minute the first time)"
  .venv/bin/python -m pip install --disable-pip-version-check -q -U pip
  .venv/bin/python -m pip install --disable-pip-version-check --progress-bar on -q -e '.[test,rocksdb,vector]'
  rm -f .venv/.installed-*
  touch "$stamp"
else
  echo "[setup] .venv is up to date"
fi
