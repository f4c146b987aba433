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
# The `ray` extra (tests/integration/test_ray_train.py starts a local Ray cluster): Ray Train pulls no torch.
.venv/bin/python -m pip install --quiet -c constraints-ci.txt -e ".[ray]"
# LitGPT (tests/integration/test_litgpt.py) without its dependencies: it pins huggingface-hub<1.4 and
# jsonargparse<=4.41, against the dev extra's transformers (huggingface-hub>=1.31). What its commands import
# (jsonargparse[signatures], tokenizers, safetensors, huggingface_hub, torchmetrics, psutil, tqdm, PyYAML) comes with
# the dev extra; lightning and torch are the ones above.
.venv/bin/python -m pip install --quiet --no-deps litgpt==0.5.13
# The `deepspeed` extra (the hpu_deepspeed tests): DeepSpeed is a source package. It is built against the torch above
# (no build isolation: its setup.py imports torch, and an isolated build could fetch another torch) and compiles no
# ops (DS_BUILD_OPS=0; the CPU emulation uses none). About 35 s on a fresh venv.
.venv/bin/python -m pip install --quiet -c constraints-ci.txt "setuptools>=69" wheel
DS_BUILD_OPS=0 .venv/bin/python -m pip install --quiet --no-build-isolation -c constraints-ci.txt -e ".[deepspeed]"
