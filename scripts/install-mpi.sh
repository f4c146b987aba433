#!/usr/bin/env bash
# Open MPI (the system's packages) and mpi4py (from PyPI) for the `mpirun` tests (tests/distributed/test_mpi.py skips
# without them), before or after scripts/setup.sh. Debian/Ubuntu, as root or with sudo; about a minute.
# mpi4py's wheel loads the system's libmpi at run time, so both come from the same Open MPI. It goes into .mpi4py/,
# which only the mpirun tests put on PYTHONPATH: with mpi4py importable, Lightning's MPI detection initializes MPI in
# every process that builds a Trainer (about a second each), which the rest of the suite does not need.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv  # as scripts/setup.sh creates it, which then installs the rest
fi
.venv/bin/python -m pip install --quiet --upgrade --target .mpi4py mpi4py
mpirun --version | sed -n 1p
PYTHONPATH=.mpi4py .venv/bin/python -c "from mpi4py import MPI; print('mpi4py on', MPI.Get_library_version().splitlines()[0])"
