#!/usr/bin/env bash
# Runs the tests on another torch/Lightning: scripts/compat.sh TORCH [LIGHTNING] [--full] [--build-only] [PYTEST ARGS...]
#
# Builds (or reuses) .venv-compat/torch-TORCH-lightning-LIGHTNING with that torch and Lightning (default 2.6.6) and the
# project's dev extras, then runs the quick subset (`pytest -m "not subprocess"`) or, with --full, the whole suite.
# Further arguments go to pytest. The versions are pinned here, for this venv only, never in the package. torch other
# than the CPU build on this machine's disk (2.13.0) comes from PyPI as a CUDA build of several GB that runs on the CPU.
# DeepSpeed is not installed (its tests skip, saying so); see docs/compat.md for the tested matrix.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() { echo "usage: scripts/compat.sh TORCH [LIGHTNING] [--full] [--build-only] [PYTEST ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
TORCH=$1; shift
LIGHTNING=2.6.6
if [ $# -ge 1 ] && [[ $1 =~ ^[0-9]+(\.[0-9]+)+$ ]]; then LIGHTNING=$1; shift; fi
[[ $TORCH =~ ^[0-9]+(\.[0-9]+)+$ ]] || usage
FULL=0; BUILD_ONLY=0; PYTEST_ARGS=()
for arg in "$@"; do
  case $arg in
    --full) FULL=1 ;;
    --build-only) BUILD_ONLY=1 ;;
    *) PYTEST_ARGS+=("$arg") ;;
  esac
done

# pip on these machines may be capped (/etc/xdg/pip: "torch<=2.14.1"): say so instead of pip's resolver error.
CAP_FILE=/etc/xdg/pip/constraints.txt
if [ -f "$CAP_FILE" ]; then
  CAP=$(sed -n 's/^torch<=\([0-9.]*\).*/\1/p' "$CAP_FILE" | head -n 1)
  if [ -n "$CAP" ] && [ "$(printf '%s\n%s\n' "$CAP" "$TORCH" | sort -V | tail -n 1)" != "$CAP" ]; then
    echo "compat.sh: torch $TORCH is newer than this machine's pip cap (torch<=$CAP in $CAP_FILE); the newest" \
      "torch pip installs here is $CAP. Run with torch<=$CAP, or lift the cap (rm -r /etc/xdg/pip) first." >&2
    exit 3
  fi
fi

VENV=.venv-compat/torch-$TORCH-lightning-$LIGHTNING
PY=$VENV/bin/python
PINS="torch==$TORCH
lightning==$LIGHTNING
pytorch-lightning==$LIGHTNING"
if [ ! -f "$VENV/.compat-ok" ] || [ "$(cat "$VENV/.compat-ok")" != "$PINS" ]; then
  echo "compat.sh: building $VENV (torch $TORCH, Lightning $LIGHTNING)" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  printf '%s\n' "$PINS" > "$VENV/constraints.txt"
  "$PY" -m pip install --quiet --upgrade pip
  "$PY" -m pip install --quiet -c "$VENV/constraints.txt" "torch==$TORCH" "lightning==$LIGHTNING"
  "$PY" -m pip install --quiet -c "$VENV/constraints.txt" -e ".[dev]"
  printf '%s\n' "$PINS" > "$VENV/.compat-ok"
fi
"$PY" -c 'import sys, torch, lightning; print(f"compat.sh: python {sys.version.split()[0]}, torch {torch.__version__},"
          f" lightning {lightning.__version__}")'
[ "$BUILD_ONLY" = 1 ] && exit 0
if [ "$FULL" = 1 ]; then
  exec "$PY" -m pytest -q "${PYTEST_ARGS[@]}"
fi
exec "$PY" -m pytest -q -m "not subprocess" "${PYTEST_ARGS[@]}"
