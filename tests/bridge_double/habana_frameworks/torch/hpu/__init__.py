"""Test double of ``habana_frameworks.torch.hpu`` (bridge 1.19: ``python_packages/habana_frameworks/torch/hpu/``).

``habana_frameworks.torch.core`` registers this module as ``torch.hpu`` (``core/__init__.py:46``), which is how Ray's
HPU accelerator and device managers and other tools find the card. The double's cards hold no tensors: a tensor
cannot live on ``torch.device("hpu")`` in a CPU build of torch, so code run against the double keeps them on the CPU.
``device_count()`` counts the cards ``HABANA_VISIBLE_MODULES`` lists, where it is set (see
``_bridge_double_state.visible_device_count``).
"""

import os

import _bridge_double_state as _state
import torch

# hpu/_utils.py:25-26
HABANA_VISIBLE_MODULES_VAR = "HABANA_VISIBLE_MODULES"
HLS_MODULE_ID_VAR = "HLS_MODULE_ID"

_initialized = False


def init():
    _lazy_init()


def _lazy_init():
    # hpu/__init__.py:67-91: the first call that needs the device opens it
    global _initialized
    _initialized = True


def is_initialized():
    _state.record("hpu.is_initialized")
    return _initialized


def is_available():
    _state.record("hpu.is_available")
    return _state.visible_device_count() > 0


def device_count():
    _state.record("hpu.device_count")
    return _state.visible_device_count()


def current_device():
    _state.record("hpu.current_device")
    _lazy_init()
    return 0


def get_device_name(device=None):
    _state.record("hpu.get_device_name", device=device)
    _lazy_init()
    return _state.config.device_name


def synchronize():
    _state.record("hpu.synchronize")
    _lazy_init()


def _get_device_index(device, optional=False):
    # hpu/_utils.py:29-66 (allow_cpu=False)
    if isinstance(device, str):
        device = torch.device(device)
    device_idx = None
    if isinstance(device, torch.device):
        if device.type != "hpu":
            raise ValueError(f"Expected a hpu device, but got: {device}")
        device_idx = device.index
    if isinstance(device, int):
        device_idx = device
    if device_idx is None:
        if optional:
            device_idx = current_device()
        else:
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
    return device_idx


def _get_module_id_from_environ():
    device_id = os.getenv(HLS_MODULE_ID_VAR, -1)
    return int(device_id) if device_id else -1


def _get_available_modules_from_environ():
    visible_modules_str = os.getenv(HABANA_VISIBLE_MODULES_VAR, default="0,1,2,3,4,5,6,7")
    return list(map(lambda x: int(x), visible_modules_str.split(",")))


def set_device(device):
    """As bridge 1.19 (``hpu/__init__.py:321-358``): the index is checked against ``HABANA_VISIBLE_MODULES`` and, where
    that is set (or 8 cards are there), exported as the card id ``HLS_MODULE_ID``."""
    _state.record("hpu.set_device", device)
    device_idx = _get_device_index(device, optional=True)
    available_modules = _get_available_modules_from_environ()
    if device_idx not in available_modules and device_idx > len(available_modules):
        raise AssertionError(
            f"Trying to open device with idx={device_idx} when only {available_modules} are avaliable)"
        )
    current_module_id = _get_module_id_from_environ()
    if current_module_id >= 0:
        for index in range(device_count()):
            if available_modules[index] == current_module_id:
                device_idx = index
                break
        assert available_modules[device_idx] == current_module_id, (
            f"Requested module_id={available_modules[device_idx]} is different from"
            f" current_module_id={current_module_id} which was previously set."
        )
    if current_module_id == -1 and HABANA_VISIBLE_MODULES_VAR not in os.environ and device_count() < 8:
        assert device_idx == 0, f"As {HABANA_VISIBLE_MODULES_VAR} is not provided, the only supported device idx is 0."
    else:
        os.environ[HLS_MODULE_ID_VAR] = str(available_modules[device_idx])
    set_device.current_device_idx = device_idx


set_device.current_device_idx = -1


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
