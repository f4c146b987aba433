"""Test double of ``habana_frameworks.torch.core`` (bridge 1.19: ``python_packages/habana_frameworks/torch/core/``).

Importing it registers ``habana_frameworks.torch.hpu`` as ``torch.hpu`` with ``torch._register_device_module``
(``core/__init__.py:46``), which raises where ``torch.hpu`` exists already (the ``bridge_double`` fixture removes the
registration with the double), and sets ``HABANA_PROFILE=profile_api_light`` where unset (``core/__init__.py:121-125,
147``).
"""

import os

import _bridge_double_state as _state
import torch

from habana_frameworks.torch import hpu

torch._register_device_module("hpu", hpu)

if "HABANA_PROFILE" not in os.environ:
    os.environ["HABANA_PROFILE"] = "profile_api_light"


def mark_step(device_str="", sync=False):
    _state.record("core.mark_step", device_str=device_str, sync=sync)
    if _state.is_lazy():  # the bridge's mark_step is lazy-only: a no-op in eager mode
        _state.launch_graph()


def is_lazy():
    _state.record("core.is_lazy")
    return _state.is_lazy()
