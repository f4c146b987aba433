"""Test double of ``habana_frameworks.torch.hpex.experimental.transformer_engine.fp8``: the FP8 autocast state."""

from contextlib import contextmanager

import _bridge_double_state as _state

_stack = []


def is_fp8_enabled():
    return bool(_stack) and _stack[-1][0]


def get_fp8_recipe():
    return _stack[-1][1] if _stack else None


@contextmanager
def fp8_autocast(enabled=False, calibrating=False, fp8_recipe=None, fp8_group=None):
    _state.record("te.fp8_autocast", enabled=enabled, calibrating=calibrating, fp8_recipe=fp8_recipe)
    _stack.append((enabled, fp8_recipe))
    try:
        yield
    finally:
        _stack.pop()
