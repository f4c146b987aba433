"""The device of torch's ``ShardedTensor`` on a rank that holds none of its shards, over HCCL: torch answers CUDA's
(``sharded_tensor/_ops/tensor_ops.py``, ``tensor_device``), so loading FSDP's sharded checkpoints would fail there.
Answered through ShardedTensor's public extension point, ``custom_sharded_op_impl``; other groups keep torch's rule.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_gaudi import hpu
from lightning_gaudi.patches import registry

_MODULE = "torch.distributed._shard.sharded_tensor"
_REGISTRY = "torch.distributed._shard.sharded_tensor.api._CUSTOM_SHARDED_OPS"
#: The op torch's ``tensor_device`` answers, and this patch answers first.
_OP = torch.Tensor.device.__get__  # type: ignore[attr-defined]
_MARK = "__lightning_gaudi_hook__"


def _custom_ops() -> dict[Any, Any] | None:
    api = registry.lookup(f"{_MODULE}.api")
    ops = getattr(api, "_CUSTOM_SHARDED_OPS", None)
    return ops if isinstance(ops, dict) else None


def missing_targets() -> list[str]:
    """What the patch relies on and this torch lacks; empty when everything is as checked."""
    missing = []
    if not callable(registry.lookup(_MODULE, "custom_sharded_op_impl")):
        missing.append(f"{_MODULE}.custom_sharded_op_impl")
    if _custom_ops() is None:
        missing.append(_REGISTRY)
    return missing


def sharded_tensor_device(types: Any, args: Any, kwargs: Any, process_group: Any) -> torch.device:
    """``ShardedTensor.device``: its first local shard's, else the HPU's on an HCCL group, else torch's rule."""
    tensor = args[0]
    shards = tensor.local_shards()
    if shards:
        return shards[0].tensor.device
    name = process_group._get_backend_name() if process_group is not None else ""
    if name == "hccl":
        return hpu.get_backend().device()
    if name == "gloo":
        return torch.device("cpu")
    return torch.device(torch.cuda.current_device())


setattr(sharded_tensor_device, _MARK, True)


def installed() -> bool:
    """Whether ``ShardedTensor.device`` is answered here."""
    ops = _custom_ops()
    return ops is not None and getattr(ops.get(_OP), _MARK, False)


def install() -> bool:
    """Registers :func:`sharded_tensor_device` for ``ShardedTensor.device`` (idempotent); returns whether it is."""
    if installed():
        return True
    fallback = (
        "Loading FSDP's sharded checkpoints over HCCL fails on a rank that holds no shard of a parameter ('Torch not"
        " compiled with CUDA enabled'): save full checkpoints (state_dict_type='full')."
    )
    if not registry.supported(missing_targets(), fallback, torch=True):
        return False
    register = registry.lookup(_MODULE, "custom_sharded_op_impl")
    register(_OP)(sharded_tensor_device)
    return True


PATCH = registry.Patch(
    name="sharded_tensor_device",
    targets=(f"{_MODULE}.custom_sharded_op_impl", _REGISTRY),
    requirement=registry.SUPPORTED_TORCH,
    install=install,
    installed=installed,
)
