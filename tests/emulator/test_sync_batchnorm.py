"""Emulated sync batch norm (``lightning_gaudi/emulator/sync_batchnorm.py``): batch norm over every rank's batch on CPU
tensors, and the torch behaviour that makes it necessary.

The canaries fail when torch changes the base class the emulated module derives from, or when torch starts running
``SyncBatchNorm`` on the CPU (then emulation could use torch's own module). The 2-process test is in
``tests/strategies/test_parallel_emulated.py``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from lightning_gaudi.emulator import sync_batchnorm
from lightning_gaudi.emulator.sync_batchnorm import EmulatedSyncBatchNorm


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo process group of this process alone."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_base_class_is_as_relied_on() -> None:
    """Canary: torch's batch norm base class takes the arguments the conversion passes and keeps the buffers."""
    parameters = inspect.signature(_BatchNorm.__init__).parameters
    arguments = ("num_features", "eps", "momentum", "affine", "track_running_stats", "device", "dtype")
    lost = [name for name in arguments if name not in parameters]
    assert not lost, f"torch's _BatchNorm.__init__ lost {lost}"
    assert set(dict(_BatchNorm(2).named_buffers())) == {"running_mean", "running_var", "num_batches_tracked"}
    assert issubclass(nn.SyncBatchNorm, _BatchNorm)
    assert issubclass(nn.BatchNorm2d, _BatchNorm)


def test_torch_still_has_no_cpu_kernels_for_sync_batchnorm() -> None:
    """Canary: torch's SyncBatchNorm function cannot run on CPU tensors (why the emulated module computes its own)."""
    with pytest.raises(NotImplementedError, match="batch_norm_stats"):
        torch.batch_norm_stats(torch.randn(4, 3), 1e-5)


def test_torch_still_refuses_sync_batchnorm_on_the_cpu(one_rank_group: None) -> None:
    """Canary: torch's DDP and SyncBatchNorm.forward refuse CPU modules and inputs."""
    with pytest.raises(ValueError, match="SyncBatchNorm layers only work with GPU modules"):
        nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(2, 3), nn.SyncBatchNorm(3)))
    with pytest.raises(ValueError, match="SyncBatchNorm expected input tensor to be on GPU"):
        nn.SyncBatchNorm(3)(torch.randn(4, 3))


def test_the_emulated_module_passes_ddp_on_the_cpu(one_rank_group: None) -> None:
    model = sync_batchnorm.convert(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)))
    ddp = nn.parallel.DistributedDataParallel(model)
    ddp(torch.randn(4, 2)).sum().backward()


@pytest.mark.parametrize(
    ("shape", "momentum", "dtype"),
    [((6, 3), 0.1, torch.float32), ((4, 3, 5, 2), None, torch.float32), ((8, 3, 7), 0.3, torch.bfloat16)],
)
def test_synced_statistics_over_one_rank_are_batch_norms(
    one_rank_group: None, shape: tuple[int, ...], momentum: float | None, dtype: torch.dtype
) -> None:
    """Over a group of one, the synchronized computation is exactly batch norm: output, gradients, running stats."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=generator) * 3 + 1).to(dtype)
    reference = nn.BatchNorm1d(3, momentum=momentum)
    with torch.no_grad():
        reference.weight.uniform_(0.5, 1.5, generator=generator)
        reference.bias.uniform_(-1, 1, generator=generator)
    emulated = sync_batchnorm.convert(nn.Sequential(nn.BatchNorm1d(3, momentum=momentum)))[0]
    emulated.load_state_dict(reference.state_dict())
    assert isinstance(emulated, EmulatedSyncBatchNorm)
    for _ in range(2):  # twice: the running statistics are updated from their previous values
        x_ref = x.float().clone().requires_grad_()
        x_emu = x.clone().requires_grad_()
        expected = F.batch_norm(
            x_ref,
            reference.running_mean,
            reference.running_var,
            reference.weight,
            reference.bias,
            True,
            1.0 / (emulated.num_batches_tracked.item() + 1) if momentum is None else momentum,
            reference.eps,
        )
        emulated.num_batches_tracked.add_(1)
        factor = 1.0 / float(emulated.num_batches_tracked) if momentum is None else momentum
        out = emulated.synced(x_emu, emulated.running_mean, emulated.running_var, factor, dist.group.WORLD)
        assert out.dtype == dtype
        grad = torch.randn(shape, generator=generator)
        (expected * grad).sum().backward()
        (out.float() * grad).sum().backward()
        tolerance = {"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
        torch.testing.assert_close(out.float(), expected, **tolerance)
        torch.testing.assert_close(x_emu.grad.float(), x_ref.grad, **tolerance)
        torch.testing.assert_close(emulated.running_mean, reference.running_mean)
        torch.testing.assert_close(emulated.running_var, reference.running_var)
    torch.testing.assert_close(emulated.weight.grad, reference.weight.grad, **tolerance)
    torch.testing.assert_close(emulated.bias.grad, reference.bias.grad, **tolerance)


def test_outside_a_group_and_in_eval_it_is_plain_batch_norm() -> None:
    x = torch.randn(6, 3)
    reference = nn.BatchNorm1d(3)
    emulated = sync_batchnorm.convert(nn.BatchNorm1d(3))
    torch.testing.assert_close(emulated(x), reference(x))
    torch.testing.assert_close(emulated.running_var, reference.running_var)
    emulated.eval()
    reference.eval()
    torch.testing.assert_close(emulated(x), reference(x))


def test_convert_and_revert_keep_the_tensors_and_classes() -> None:
    model = nn.Sequential(nn.Conv2d(1, 4, 1), nn.BatchNorm2d(4), nn.Sequential(nn.BatchNorm1d(4)), nn.SyncBatchNorm(4))
    model[1].eval()
    tensors = {name: tensor for name, tensor in model.state_dict(keep_vars=True).items()}
    converted = sync_batchnorm.convert(model)
    assert [type(m) for m in (converted[1], converted[2][0], converted[3])] == [EmulatedSyncBatchNorm] * 3
    assert all(isinstance(m, _BatchNorm) for m in (converted[1], converted[2][0], converted[3]))
    assert not converted[1].training  # the mode is kept
    assert converted.state_dict(keep_vars=True).keys() == tensors.keys()
    assert all(converted.state_dict(keep_vars=True)[name] is tensor for name, tensor in tensors.items())
    reverted = sync_batchnorm.revert(converted)
    assert [type(m) for m in (reverted[1], reverted[2][0], reverted[3])] == [
        nn.BatchNorm2d,
        nn.BatchNorm1d,
        nn.SyncBatchNorm,
    ]
    assert all(reverted.state_dict(keep_vars=True)[name] is tensor for name, tensor in tensors.items())
    assert sync_batchnorm.revert(nn.Sequential(EmulatedSyncBatchNorm(2)))[0].__class__ is nn.SyncBatchNorm
