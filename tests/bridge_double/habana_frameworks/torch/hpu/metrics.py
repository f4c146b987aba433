"""Test double of ``habana_frameworks.torch.hpu.metrics``."""

import os

import _bridge_double_state as _state

_DEFAULTS = {
    "graph_compilation": [("TotalNumber", 0), ("TotalTime", 0), ("AvgTime", 0)],
    "cpu_fallback": [("TotalNumber", 0), ("FallbackOps", {})],
    "memory_defragmentation": [("TotalNumber", 0), ("TotalTime", 0)],
    "recipe_cache": [("TotalHit", 0), ("TotalMiss", 0)],
}


class _Metric:
    def __init__(self, name):
        self.name = name

    def stats(self):
        _state.record("metrics.stats", self.name)
        return list(_state.config.metrics.get(self.name, _DEFAULTS[self.name]))

    def reset(self):
        _state.record("metrics.reset", self.name)
        _state.config.metrics[self.name] = list(_DEFAULTS[self.name])


def metric_global(name):
    _state.record("metrics.metric_global", name)
    if name not in _DEFAULTS:
        raise ValueError(f"unknown global metric {name!r}")
    if name == "recipe_cache" and os.getenv("PT_HPU_ENABLE_CACHE_METRICS", "false").lower() != "true":
        return None
    return _Metric(name)
