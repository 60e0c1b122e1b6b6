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

# The compiled hot paths (native/, Rust through PyO3 and maturin: the accumulator's
# transition, Kafka's partitioner): built where cargo is (rustup puts it in ~/.cargo/bin);
# without it their Python twins run alone and do the same (streams/native.py).
[[ -x $HOME/.cargo/bin/cargo ]] && PATH="$PATH:$HOME/.cargo/bin"
native_stamp=".venv/.native-$(cat native/Cargo.toml native/Cargo.lock native/src/*.rs | sha256sum | cut -c1-16)"
if [[ ! -f $native_stamp ]]; then
  if command -v cargo >/dev/null 2>&1; then
    echo "[setup] building the compiled hot paths (native/, Rust: a minute the first time)"
    .venv/bin/python -m pip install --disable-pip-version-check -q ./native
    rm -f .venv/.native-*
    touch "$native_stamp"
  else
    echo "[setup] no cargo: the transition and the partitioner run in Python (install Rust to compile them)"
  fi
fi

# The session view's browser test (tests/integration/test_view.py) drives a headless Chromium.
# Debian's packages, installed when missing and apt-get can (as root, or sudo
# without a password); otherwise that test skips and says why.
if ! command -v chromedriver >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo="sudo -n"; fi
  fi
  if [[ $(id -u) -eq 0 || -n $sudo ]]; then
    echo "[setup] installing chromium and chromium-driver for the browser test (apt-get)"
    if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
        $sudo apt-get install -y -qq --no-install-recommends chromium chromium-driver; } >/dev/null 2>&1; then
      echo "[setup] could not install chromium (apt-get failed): the browser test will skip"
    fi
  else
    echo "[setup] no chromium: the browser test will skip (apt-get install chromium chromium-driver)"
  fi
fi
