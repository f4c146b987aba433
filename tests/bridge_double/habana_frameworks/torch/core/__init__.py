"""Test double of ``habana_frameworks.torch.core``."""

import _bridge_double_state as _state


def mark_step(device_str="", sync=False):
    _state.record("core.mark_step", device_str=device_str, sync=sync)
    if _state.is_lazy():  # the bridge's mark_step is lazy-only: a no-op in eager mode
        _state.launch_graph()


def is_lazy():
    _state.record("core.is_lazy")
    return _state.is_lazy()
