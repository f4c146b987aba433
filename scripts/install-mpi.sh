#!/usr/bin/env bash
# Open MPI (the system's packages) and mpi4py (from PyPI, into .venv) for `mpirun` launches and their tests
# (tests/distributed/test_mpi.py skips without them). Debian/Ubuntu; run as root or with sudo available; about a minute.
# mpi4py's wheel loads the system's libmpi at run time, so both come from the same Open MPI.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v mpirun >/dev/null 2>&1; then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openmpi-bin libopenmpi-dev
fi
.venv/bin/python -m pip install --quiet mpi4py
mpirun --version | head -n 1
.venv/bin/python -c "from mpi4py import MPI; print('mpi4py on', MPI.Get_library_version().splitlines()[0])"
