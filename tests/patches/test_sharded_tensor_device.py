"""Canary of patches/sharded_tensor_device.py: ShardedTensor's device on a rank without a shard, over HCCL. The end to
end run is the Fabric FSDP job in tests/fabric/test_model_parallel.py (its sharded checkpoint resumes on 2 ranks)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from lightning_gaudi import hpu
from lightning_gaudi.patches import sharded_tensor_device as patch


def test_installed_where_torch_has_the_extension_point() -> None:
    assert patch.missing_targets() == []
    assert patch.installed()
    assert patch.PATCH.install()  # idempotent


def _sharded(shards: list[torch.Tensor]) -> SimpleNamespace:
    return SimpleNamespace(local_shards=lambda: [SimpleNamespace(tensor=t) for t in shards])


def _group(name: str) -> SimpleNamespace:
    return SimpleNamespace(_get_backend_name=lambda: name)


def test_an_empty_shard_on_hccl_is_on_the_hpu(eager_hpu: hpu.Backend) -> None:
    device = patch.sharded_tensor_device((), (_sharded([]),), {}, _group("hccl"))
    assert device == eager_hpu.device()


def test_elsewhere_torchs_rule_holds() -> None:
    assert patch.sharded_tensor_device((), (_sharded([]),), {}, _group("gloo")) == torch.device("cpu")
    local = torch.ones(1, device="meta")
    assert patch.sharded_tensor_device((), (_sharded([local]),), {}, _group("hccl")) == torch.device("meta")


def test_torch_still_answers_cuda_for_an_empty_shard_off_gloo() -> None:
    """When this fails, torch no longer sends an empty shard to CUDA on other backends: the patch may go."""
    import inspect

    from torch.distributed._shard.sharded_tensor._ops import tensor_ops

    source = inspect.getsource(tensor_ops.tensor_device)
    assert '== "gloo"' in source
    assert "torch.cuda.current_device()" in source
