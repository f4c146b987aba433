"""Test double of ``habana_frameworks.torch``: importing it, like the bridge, loads the core module."""

import _bridge_double_state as _state

_state.record("import habana_frameworks.torch")

from habana_frameworks.torch import core as core  # noqa: E402
from habana_frameworks.torch import hpu as hpu  # noqa: E402
