"""Test double of ``habana_frameworks.torch`` (bridge 1.19: ``python_packages/habana_frameworks/torch/__init__.py``).

Importing it, like importing the bridge (or any of its modules, which imports this package first), sets
``TORCHINDUCTOR_COMPILE_THREADS=1`` (line 23) and imports ``core`` (which registers ``torch.hpu``),
``distributed.hccl`` (which sets the launcher variables it finds missing: ``MASTER_ADDR=localhost``,
``MASTER_PORT=12345`` among them, and registers the ``"hccl"`` backend) and ``hpu`` (lines 54-56), in that order.
"""

import os

import _bridge_double_state as _state

os.environ["TORCHINDUCTOR_COMPILE_THREADS"] = "1"

_state.record("import habana_frameworks.torch")

from habana_frameworks.torch import core as core  # noqa: E402
from habana_frameworks.torch import hpu as hpu  # noqa: E402
from habana_frameworks.torch.distributed import hccl as _hccl  # noqa: E402, F401
