"""Test double of ``habana_frameworks.torch.hpu``."""

import _bridge_double_state as _state


def is_available():
    _state.record("hpu.is_available")
    return _state.config.device_count > 0


def device_count():
    _state.record("hpu.device_count")
    return _state.config.device_count


def current_device():
    _state.record("hpu.current_device")
    return 0


def get_device_name(device=None):
    _state.record("hpu.get_device_name", device=device)
    return _state.config.device_name


def synchronize():
    _state.record("hpu.synchronize")


def set_device(device):
    _state.record("hpu.set_device", device)


def memory_stats(device=None):
    _state.record("hpu.memory_stats", device=device)
    return _state.memory()


def memory_allocated(device=None):
    _state.record("hpu.memory_allocated", device=device)
    return _state.memory()["InUse"]


def max_memory_allocated(device=None):
    _state.record("hpu.max_memory_allocated", device=device)
    return _state.memory()["MaxInUse"]


def reset_peak_memory_stats(device=None):
    _state.record("hpu.reset_peak_memory_stats", device=device)
    _state.config.memory["MaxInUse"] = _state.memory()["InUse"]


def mem_get_info(device=None):
    _state.record("hpu.mem_get_info", device=device)
    stats = _state.memory()
    return stats["Limit"] - stats["InUse"], stats["Limit"]


def enable_dynamic_shape():
    _state.record("hpu.enable_dynamic_shape")


def disable_dynamic_shape():
    _state.record("hpu.disable_dynamic_shape")


def __getattr__(name):
    # the bridge imports wrap_in_hpu_graph (graphs.py) in lazy mode only
    if name == "wrap_in_hpu_graph" and _state.is_lazy():
        return _wrap_in_hpu_graph
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _wrap_in_hpu_graph(module, asynchronous=False, disable_tensor_cache=False, dry_run=False, max_graphs=None):
    _state.record(
        "hpu.wrap_in_hpu_graph",
        module,
        asynchronous=asynchronous,
        disable_tensor_cache=disable_tensor_cache,
        dry_run=dry_run,
        max_graphs=max_graphs,
    )
    # like the bridge: the module's forward is replaced in place by one that replays the captured graph
    plain = module.forward

    def replay(*args, **kwargs):
        _state.record("hpu.graph_replay", module)
        return plain(*args, **kwargs)

    module.forward = replay
    return module
