"""Test double of ``habana_frameworks.torch.hpu.metrics`` (names and tags as in bridge 1.19, docs/conformance.md)."""

import os

import _bridge_double_state as _state

_DEFAULTS = {
    "graph_compilation": [("TotalNumber", 0), ("TotalTime", 0), ("AvgTime", 0)],
    "cpu_fallback": [("TotalNumber", 0), ("FallbackOps", {})],
    "memory_defragmentation": [("TotalNumber", 0), ("TotalSuccessful", 0), ("AvgTime", 0), ("MaxTime", 0)],
    "recipe_cache": [("TotalHit", 0), ("RecipeHit", {}), ("TotalMiss", 0), ("RecipeMiss", {})],
}
_TRUE = ("y", "yes", "t", "true", "on", "1")


class _Metric:
    def __init__(self, name):
        self._name = name

    def name(self):
        return self._name

    def stats(self):
        _state.record("metrics.stats", self._name)
        return list(_state.config.metrics.get(self._name, _DEFAULTS[self._name]))

    def reset(self):
        _state.record("metrics.reset", self._name)
        _state.config.metrics[self._name] = list(_DEFAULTS[self._name])


def metric_global(name):
    _state.record("metrics.metric_global", name)
    if name not in _DEFAULTS:
        return None
    if name == "recipe_cache" and os.getenv("PT_HPU_ENABLE_CACHE_METRICS", "").lower() not in _TRUE:
        return None
    return _Metric(name)
