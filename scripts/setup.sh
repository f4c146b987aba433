#!/usr/bin/env bash
# Creates .venv (if missing) with lightning_gaudi and its dev tools. torch is pinned to the CPU build through
# constraints-ci.txt, for development and CI only; on Gaudi, use the torch from Intel's stack instead.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -c constraints-ci.txt torch==2.13.0
.venv/bin/python -m pip install --quiet -c constraints-ci.txt -e ".[dev]"
