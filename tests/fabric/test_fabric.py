"""Lightning Fabric on the HPU (``lightning_gaudi.fabric``): names, devices, precision, lazy-mode graph cuts,
checkpoints, compiled models, the DDP settings and bad input. The 2-process run is in ``test_fabric_ddp.py``."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.fabric import Fabric, seed_everything
from lightning.fabric.accelerators import ACCELERATOR_REGISTRY
from lightning.fabric.plugins import MixedPrecision
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from lightning.fabric.strategies import STRATEGY_REGISTRY, DDPStrategy, SingleDeviceStrategy
from lightning.fabric.strategies.launchers.multiprocessing import _MultiProcessingLauncher
from lightning.fabric.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

import lightning_gaudi
from lightning_gaudi import HPUAccelerator, HPUCheckpointIO, hpu
from lightning_gaudi.distributed import InvalidLaunchError
from lightning_gaudi.fabric import HPUParallelStrategy, HPUPrecision, SingleHPUStrategy
from lightning_gaudi.hpu import runtime

FEATURES = 4


def _net() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 8), nn.Tanh(), nn.Linear(8, 1))


def _batches(steps: int, batch_size: int = 4) -> list[tuple[Tensor, Tensor]]:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(steps * batch_size, FEATURES, generator=generator)
    y = x.sum(dim=1, keepdim=True)
    return [(x[i : i + batch_size], y[i : i + batch_size]) for i in range(0, len(x), batch_size)]


def _train(fabric: Fabric, model: nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for x, y in _batches(steps):
        x, y = fabric.to_device((x, y))
        loss = ((model(x) - y) ** 2).mean()  # written out: Lazy Tensor Core runs it without a CPU fallback
        fabric.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


def _cpu_weights(module: nn.Module) -> dict[str, Tensor]:
    return {name: tensor.detach().cpu().clone() for name, tensor in module.state_dict().items()}


# ----------------------------------------------------------------------------------------------------------------------
# Names and instances
# ----------------------------------------------------------------------------------------------------------------------


def test_hpu_names_are_registered_with_fabric() -> None:
    assert ACCELERATOR_REGISTRY["hpu"]["accelerator"] is HPUAccelerator
    expected = {
        "hpu_single": (SingleHPUStrategy, {}),
        "hpu_parallel": (HPUParallelStrategy, {}),
        "hpu_ddp": (HPUParallelStrategy, {}),
        "hpu_parallel_spawn": (HPUParallelStrategy, {"start_method": "spawn"}),
        "hpu_parallel_find_unused_parameters_true": (HPUParallelStrategy, {"find_unused_parameters": True}),
        "hpu_parallel_static_graph": (HPUParallelStrategy, {"static_graph": True}),
    }
    for name, (cls, init_params) in expected.items():
        assert STRATEGY_REGISTRY[name]["strategy"] is cls, name
        assert STRATEGY_REGISTRY[name]["init_params"] == init_params, name
    lightning_gaudi.register()  # again: harmless
    assert STRATEGY_REGISTRY["hpu_parallel"]["strategy"] is HPUParallelStrategy


@pytest.mark.parametrize(
    ("devices", "num_nodes", "expected"),
    [(1, 1, SingleHPUStrategy), ([3], 1, SingleHPUStrategy), (2, 1, HPUParallelStrategy), (1, 2, HPUParallelStrategy)],
)
def test_auto_strategy(eager_hpu: hpu.Backend, devices: Any, num_nodes: int, expected: type) -> None:
    fabric = Fabric(accelerator="hpu", devices=devices, num_nodes=num_nodes)
    assert type(fabric.strategy) is expected
    assert isinstance(fabric.accelerator, HPUAccelerator)
    assert isinstance(fabric.strategy.checkpoint_io, HPUCheckpointIO)
    assert fabric.device == torch.device("cpu")  # the emulated HPU under eager emulation
    if expected is HPUParallelStrategy:
        assert fabric.world_size == (devices if isinstance(devices, int) else len(devices)) * num_nodes
        assert fabric.strategy.process_group_backend == "hccl"


def test_single_by_name(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", strategy="hpu_single")  # devices="auto" is one device for one-device strategies
    assert type(fabric.strategy) is SingleHPUStrategy
    assert fabric.device == torch.device("cpu")
    assert fabric.strategy.launcher is None


@pytest.mark.parametrize(
    ("name", "start_method", "settings"),
    [
        ("hpu_parallel", "popen", {"static_graph": False, "find_unused_parameters": False}),
        ("hpu_ddp", "popen", {"static_graph": False}),
        ("hpu_parallel_spawn", "spawn", {"static_graph": False}),
        ("hpu_parallel_static_graph", "popen", {"static_graph": True}),
        ("hpu_parallel_find_unused_parameters_true", "popen", {"find_unused_parameters": True}),
    ],
)
def test_parallel_by_name(eager_hpu: hpu.Backend, name: str, start_method: str, settings: dict[str, bool]) -> None:
    fabric = Fabric(accelerator="hpu", strategy=name, devices=2, num_nodes=1)
    strategy = fabric.strategy
    assert type(strategy) is HPUParallelStrategy
    launcher = _SubprocessScriptLauncher if start_method == "popen" else _MultiProcessingLauncher
    assert isinstance(strategy.launcher, launcher)
    assert strategy.parallel_devices == [torch.device("cpu")] * 2
    assert strategy.ddp_kwargs["gradient_as_bucket_view"] is True  # Intel's advice, on by default, as in the Trainer
    for key, value in settings.items():
        assert strategy.ddp_kwargs[key] is value


def test_instances(eager_hpu: hpu.Backend) -> None:
    strategy = HPUParallelStrategy(bucket_cap_mb=100, static_graph=True, gradient_as_bucket_view=False, timeout=90)
    fabric = Fabric(accelerator=HPUAccelerator(), strategy=strategy, devices=2, precision="bf16-mixed")
    assert fabric.strategy is strategy
    assert strategy.ddp_kwargs == {
        "bucket_cap_mb": 100,
        "gradient_as_bucket_view": False,
        "static_graph": True,
        "find_unused_parameters": False,
    }
    assert strategy.timeout.total_seconds() == 90
    assert isinstance(strategy.precision, HPUPrecision)
    single = SingleHPUStrategy(device="hpu")
    assert Fabric(accelerator="hpu", strategy=single).strategy is single
    assert single.root_device == torch.device("cpu")


@pytest.mark.parametrize(
    ("name", "start_method", "find_unused_parameters"),
    [("ddp", "popen", False), ("ddp_spawn", "spawn", False), ("ddp_find_unused_parameters_true", "popen", True)],
)
def test_lightning_ddp_names_run_the_hpu_strategy(
    eager_hpu: hpu.Backend, name: str, start_method: str, find_unused_parameters: bool
) -> None:
    strategy = Fabric(accelerator="hpu", strategy=name, devices=2).strategy
    assert type(strategy) is HPUParallelStrategy
    launcher = _SubprocessScriptLauncher if start_method == "popen" else _MultiProcessingLauncher
    assert isinstance(strategy.launcher, launcher)
    assert strategy.ddp_kwargs["find_unused_parameters"] is find_unused_parameters


def test_other_accelerators_keep_lightnings_classes(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2, precision="bf16-mixed")
    assert type(fabric.strategy) is DDPStrategy
    assert type(fabric.strategy.precision) is MixedPrecision
    assert type(Fabric(accelerator="cpu", devices=1).strategy) is SingleDeviceStrategy


# ----------------------------------------------------------------------------------------------------------------------
# Bad input: clear errors while Fabric is built
# ----------------------------------------------------------------------------------------------------------------------


def test_unknown_hpu_strategy_name(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`strategy='hpu_paralel'` is not a strategy.*Did you mean 'hpu_parallel'\?"):
        Fabric(accelerator="hpu", strategy="hpu_paralel", devices=2)
    with pytest.raises(ValueError, match=r"`strategy='hpu_deepspeed'` is not a strategy.*'hpu_single', 'hpu_parallel'"):
        Fabric(accelerator="cpu", strategy="hpu_deepspeed")


@pytest.mark.parametrize("name", ["ddp_fork", "ddp_notebook"])
def test_forking_ddp_is_refused(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` forks.*'hpu_parallel'.*'hpu_parallel_spawn'"):
        Fabric(accelerator="hpu", strategy=name, devices=2)


@pytest.mark.parametrize("name", ["deepspeed", "dp", "xla"])
def test_strategies_without_an_hpu_version_are_refused(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` .* does not run on HPUs.*'hpu_parallel'"):
        Fabric(accelerator="hpu", strategy=name, devices=2)


def test_trainer_strategies_are_refused_naming_fabrics(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"lightning_gaudi.SingleHPUStrategy is the Trainer's.*lightning_gaudi.fabric"):
        Fabric(accelerator="hpu", strategy=lightning_gaudi.SingleHPUStrategy())
    with pytest.raises(ValueError, match=r"With Fabric use lightning_gaudi.fabric.HPUParallelStrategy\(...\)"):
        Fabric(accelerator="hpu", strategy=lightning_gaudi.HPUParallelStrategy(bucket_cap_mb=50), devices=2)


def test_single_hpu_with_several_devices_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"trains on one HPU, but Fabric asks for 2 device\(s\).*'hpu_parallel'"):
        Fabric(accelerator="hpu", strategy="hpu_single", devices=2)


def test_an_hpu_strategy_on_another_accelerator_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"runs on HPUs, but the accelerator is CPUAccelerator.*accelerator='hpu'"):
        Fabric(accelerator="cpu", strategy="hpu_parallel", devices=2)


def test_parallel_is_refused_in_lazy_emulation(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="cannot run here: Lazy emulation drives one HPU"):
        Fabric(accelerator="hpu", strategy="hpu_parallel", devices=1)


def test_bad_ddp_settings(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`bucket_cap_mb=0` must be a positive number of megabytes"):
        HPUParallelStrategy(bucket_cap_mb=0)
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'static_grpah'.*Did you mean 'static_graph'"):
        HPUParallelStrategy(static_grpah=True)
    with pytest.raises(TypeError, match=r"`device_ids` is set by HPUParallelStrategy itself"):
        HPUParallelStrategy(device_ids=[0])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'model_averaging_period'"):
        HPUParallelStrategy(model_averaging_period=4)  # the Trainer's DDPStrategy takes it; Fabric's does not
    with pytest.raises(ValueError, match=r"start_method='fork'.*'popen' or 'spawn'"):
        HPUParallelStrategy(start_method="fork")  # type: ignore[arg-type]


def test_a_bad_launch_fails_while_fabric_is_built(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before any process starts: the torchrun world disagrees with num_nodes x devices."""
    values = {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "4",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "GROUP_RANK": "0",
        "LOCAL_WORLD_SIZE": "2",
        "TORCHELASTIC_RUN_ID": "test",
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(InvalidLaunchError, match=r"WORLD_SIZE=4.*num_nodes=1 x devices=2 = 2 processes"):
        Fabric(accelerator="hpu", strategy="hpu_parallel", devices=2, num_nodes=1)
    monkeypatch.setenv("MASTER_PORT", "70000")
    with pytest.raises(InvalidLaunchError, match=r"MASTER_PORT='70000' is not a TCP port"):
        Fabric(accelerator="hpu", strategy="hpu_parallel", devices=2, num_nodes=2)


def test_a_device_that_is_not_an_hpu_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"SingleHPUStrategy got device meta; pass an HPU device"):
        Fabric(accelerator="hpu", strategy=SingleHPUStrategy(device="meta"))


# ----------------------------------------------------------------------------------------------------------------------
# Precision
# ----------------------------------------------------------------------------------------------------------------------


def test_bf16_mixed_autocasts_on_the_hpu_device_type(eager_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", devices=1, precision="bf16-mixed")
    precision = fabric.strategy.precision
    assert isinstance(precision, HPUPrecision)
    assert precision.device == "cpu"  # eager emulation's autocast device type (the HPU's on a Gaudi)
    model = fabric.setup(_net())
    seen: list[torch.dtype] = []
    model.module[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # stock Fabric: "CUDA is not available ... Disabling autocast" and fp32
        out = model(torch.randn(2, FEATURES))
    assert seen == [torch.bfloat16]
    assert out.dtype == torch.float32  # Fabric hands outputs back in the default dtype


def test_16_mixed_where_the_hpu_has_fp16(eager_hpu: hpu.Backend) -> None:
    precision = Fabric(accelerator="hpu", precision="16-mixed").strategy.precision
    assert isinstance(precision, HPUPrecision)
    assert precision.scaler is not None


def test_16_mixed_is_refused_on_first_generation_gaudi(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    hpu._backends.clear()
    for precision in ("16-mixed", "16", 16, "16-true"):
        with pytest.raises(ValueError, match=r"needs float16, which first-generation Gaudi \(GAUDI\) does not have"):
            Fabric(accelerator="hpu", precision=precision)
    with pytest.raises(ValueError, match=r"first-generation Gaudi"):
        HPUPrecision("16-mixed")
    assert isinstance(Fabric(accelerator="hpu", precision="bf16-mixed").strategy.precision, HPUPrecision)


def test_precisions_the_hpu_lacks_are_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`precision='64-true'` cannot run on an HPU"):
        Fabric(accelerator="hpu", precision="64-true")
    with pytest.raises(ValueError, match=r"MixedPrecision \(precision 'bf16-mixed'\) autocasts on 'cuda'"):
        Fabric(accelerator="hpu", plugins=[MixedPrecision("bf16-mixed", device="cuda")])
    with pytest.raises(
        ValueError, match=r"HPUPrecision \(precision 'bf16-mixed'\) is a precision plugin of the Trainer"
    ):
        Fabric(accelerator="hpu", devices=1, plugins=[lightning_gaudi.HPUPrecision("bf16-mixed")])
    with pytest.raises(ValueError, match=r"HPUPrecision got `precision='bf16-true'`"):
        HPUPrecision("bf16-true")  # type: ignore[arg-type]


def test_mixed_precision_is_refused_in_lazy_emulation(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"needs torch.autocast.*'bf16-true'"):
        Fabric(accelerator="hpu", precision="bf16-mixed")


def test_clipping_a_fused_optimizer_under_16_mixed(eager_hpu: hpu.Backend) -> None:
    """Stock Fabric refuses to clip optimizers that unscale in ``step()``; the HPU precision unscales them first."""
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)  # the default 65536 overflows this net's fp16 backward
    fabric = Fabric(accelerator="hpu", devices=1, plugins=[HPUPrecision("16-mixed", scaler=scaler)])
    model = _net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, fused=True)
    model, optimizer = fabric.setup(model, optimizer)
    before = _cpu_weights(model)
    x, y = _batches(1)[0]
    fabric.backward(((model(x).float() - y) ** 2).mean())
    norm = fabric.clip_gradients(model, optimizer, max_norm=1e-3)
    assert float(norm) > 1e-3
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in model.parameters()]))
    assert float(total) == pytest.approx(1e-3, rel=1e-3)  # true (unscaled) gradients, clipped
    optimizer.step()
    assert any(not torch.equal(before[name], tensor) for name, tensor in _cpu_weights(model).items())


# ----------------------------------------------------------------------------------------------------------------------
# Lazy mode: the device, the optimizer's parameters and the graph cuts
# ----------------------------------------------------------------------------------------------------------------------


class _Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(FEATURES, FEATURES, bias=False)
        self.out = nn.Linear(FEATURES, FEATURES, bias=False)
        self.out.weight = self.embed.weight
        self.head = nn.Linear(FEATURES, 1)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(torch.tanh(self.out(torch.tanh(self.embed(x)))))


def test_hpu_accelerator_instance_trains_on_the_lazy_device(lazy_hpu: hpu.Backend) -> None:
    """Stock Fabric picks device "cpu" for an accelerator instance: in lazy emulation it then fails to move the model
    (or, in eager emulation, trains on the CPU without a word)."""
    seed_everything(0, verbose=False)
    fabric = Fabric(accelerator=HPUAccelerator())
    assert type(fabric.strategy) is SingleHPUStrategy
    assert fabric.device.type == "lazy"
    model = _Tied()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # made before setup, on the CPU parameters
    before = _cpu_weights(model)
    model, optimizer = fabric.setup(model, optimizer)
    params = list(model.parameters())
    assert {p.device.type for p in params} == {"lazy"}
    assert model.module.out.weight is model.module.embed.weight  # tied weights stay tied
    assert [id(p) for group in optimizer.param_groups for p in group["params"]] == [id(p) for p in params]
    _train(fabric, model, optimizer, steps=2)
    after = _cpu_weights(model)
    assert all(not torch.equal(before[name], after[name]) for name in before)
    torch.testing.assert_close(after["out.weight"], after["embed.weight"])


class _GatedChunks(nn.Module):
    """A gated linear unit cut with ``chunk``: Lazy Tensor Core hands back CPU pieces, the forward fails."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = nn.Linear(FEATURES, 2 * FEATURES)

    def forward(self, x: Tensor) -> Tensor:
        value, gate = self.gate(x).chunk(2, dim=-1)
        return x + value * torch.sigmoid(gate)


def test_lazy_emulation_limit_gets_the_trainers_note(lazy_hpu: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", devices=1)
    model = fabric.setup(_GatedChunks())
    with pytest.raises(RuntimeError, match="Input tensor is not a lazy tensor") as info:
        model(torch.randn(4, FEATURES, device=fabric.device))
    assert str(info.value).count("limit of lazy emulation") == 1
    assert "LIGHTNING_GAUDI_EMULATE=eager" in str(info.value)
    with pytest.raises(RuntimeError, match="limit of lazy emulation"):  # in fabric.backward too
        fabric.backward(_FailsInBackward.apply(torch.ones((), requires_grad=True, device=fabric.device)))


class _FailsInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        raise RuntimeError("Input tensor is not a lazy tensor: torch.FloatTensor")  # what LTC raises on a CPU piece


@pytest.fixture
def lazy_counts(lazy_hpu: hpu.Backend) -> hpu.Backend:
    lazy_hpu.mark_step()
    lazy_hpu.reset_lazy_counters()
    return lazy_hpu


def test_lazy_mode_cuts_twice_per_step(lazy_counts: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", strategy="hpu_single")
    model = _net()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    lazy_counts.reset_lazy_counters()
    _train(fabric, model, optimizer, steps=3)
    counters = lazy_counts.lazy_counters()
    assert counters is not None
    assert counters.mark_steps == 2 * 3


def test_lazy_mode_cuts_can_be_turned_off(lazy_counts: hpu.Backend) -> None:
    fabric = Fabric(accelerator="hpu", strategy=SingleHPUStrategy(mark_step=False))
    model = _net()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    lazy_counts.reset_lazy_counters()
    _train(fabric, model, optimizer, steps=2)
    counters = lazy_counts.lazy_counters()
    assert counters is not None
    assert counters.mark_steps == 0


def test_eager_mode_never_cuts(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[None] = []
    monkeypatch.setattr(eager_hpu, "mark_step", lambda: calls.append(None))
    fabric = Fabric(accelerator="hpu", devices=1)
    model = _net()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    _train(fabric, model, optimizer, steps=2)
    assert calls == []


def test_lazy_mode_cuts_on_a_gaudi(bridge_double: ModuleType) -> None:
    """On a Gaudi in lazy mode the strategy calls the bridge's ``mark_step`` after backward and after the step."""
    strategy = Fabric(accelerator="hpu", strategy="hpu_single").strategy
    assert strategy.root_device == torch.device("hpu")
    model = _net()  # CPU tensors: the double has no "hpu" tensors, so the strategy's hooks are driven directly
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.setup_module(model)
    bridge_double.reset()
    strategy.backward(model(torch.randn(2, FEATURES)).sum(), model)
    assert bridge_double.names().count("core.mark_step") == 1
    strategy.optimizer_step(optimizer)
    assert bridge_double.names().count("core.mark_step") == 2


# ----------------------------------------------------------------------------------------------------------------------
# Checkpoints and compiled models
# ----------------------------------------------------------------------------------------------------------------------


def test_fabric_save_writes_cpu_tensors_atomically(
    lazy_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the compile cache policy off: after an earlier test compiled in this process, the save puts that process's
    # artifacts beside the checkpoint, by design (tests/test_compile_cache.py)
    monkeypatch.setenv(runtime.COMPILE_CACHE_ENV, "off")
    fabric = Fabric(accelerator="hpu")
    model = _net()
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    _train(fabric, model, optimizer, steps=1)
    path = tmp_path / "ckpt" / "step.ckpt"
    fabric.save(path, {"model": model, "optimizer": optimizer, "step": 1})
    assert os.listdir(path.parent) == ["step.ckpt"]  # written through a temporary and renamed
    state = torch.load(path, map_location=None, weights_only=True)
    tensors = [t for t in state["model"].values()] + [state["optimizer"]["state"][0]["momentum_buffer"]]
    assert {t.device.type for t in tensors} == {"cpu"}
    assert state["step"] == 1
    saved = _cpu_weights(model)

    restored = _net()
    fabric2 = Fabric(accelerator="hpu")
    restored_model, restored_optimizer = fabric2.setup(restored, torch.optim.SGD(restored.parameters(), lr=0.1))
    remainder = fabric2.load(path, {"model": restored_model, "optimizer": restored_optimizer})
    assert remainder == {"step": 1}
    for name, tensor in _cpu_weights(restored_model).items():
        torch.testing.assert_close(tensor, saved[name])
    assert next(restored_model.parameters()).device.type == "lazy"


def test_setup_keeps_a_compiled_model_compiled(eager_hpu: hpu.Backend) -> None:
    from torch._dynamo.eval_frame import OptimizedModule

    fabric = Fabric(accelerator="hpu", devices=1, precision="bf16-mixed")
    net = _net()
    compiled = torch.compile(net, backend=eager_hpu.compile_backend)
    model, optimizer = fabric.setup(compiled, torch.optim.SGD(net.parameters(), lr=0.1))
    assert isinstance(model._forward_module, OptimizedModule)
    before = _cpu_weights(net)
    _train(fabric, model, optimizer, steps=2)
    assert any(not torch.equal(before[name], tensor) for name, tensor in _cpu_weights(net).items())


# ----------------------------------------------------------------------------------------------------------------------
# One process through DistributedDataParallel (the 2-process run is in test_fabric_ddp.py)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def one_process_group(eager_hpu: hpu.Backend, isolated_env: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        isolated_env.delenv(name, raising=False)
    isolated_env.setenv("MASTER_ADDR", "127.0.0.1")
    isolated_env.setenv("MASTER_PORT", str(find_free_network_port()))
    isolated_env.setenv("OMP_NUM_THREADS", "1")  # or Fabric's launcher sets torch's threads for the process
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_ddp_settings_reach_distributed_data_parallel(one_process_group: None) -> None:
    hook_calls: list[int] = []

    def hook(state, bucket):  # type: ignore[no-untyped-def]  # unannotated: DDP checks string annotations
        hook_calls.append(1)
        return allreduce_hook(state, bucket)

    strategy = HPUParallelStrategy(
        bucket_cap_mb=0.5, gradient_as_bucket_view=True, static_graph=True, ddp_comm_hook=hook
    )
    fabric = Fabric(accelerator="hpu", strategy=strategy, devices=1, precision="bf16-mixed")
    fabric.launch()
    assert dist.get_backend() == "hccl"
    assert isinstance(strategy.cluster_environment, LightningEnvironment)
    net = _net()
    model, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
    ddp = model._forward_module
    assert isinstance(ddp, DistributedDataParallel)
    assert ddp.bucket_bytes_cap == int(0.5 * 1024 * 1024)
    assert ddp.gradient_as_bucket_view
    assert ddp.static_graph
    x, y = _batches(1)[0]
    fabric.backward(((model(x) - y) ** 2).mean())
    assert hook_calls
    optimizer.step()
    # the first step's gradients are released, so DDP's bucket rebuild never holds two gradient copies
    assert all(p.grad is None for p in net.parameters())
    assert fabric.all_reduce(torch.tensor([1, 3]), reduce_op="sum").tolist() == [1.0, 3.0]
    with pytest.raises(ValueError, match=r"`reduce_op='median'` is not a reduction"):
        fabric.all_reduce(torch.tensor([1.0]), reduce_op="median")


# ----------------------------------------------------------------------------------------------------------------------
# The bridge path (a double of Intel's habana_frameworks)
# ----------------------------------------------------------------------------------------------------------------------


def test_on_a_gaudi_the_device_is_hpu_and_the_backend_hccl(bridge_double: ModuleType) -> None:
    fabric = Fabric(accelerator="hpu", strategy="hpu_parallel", devices=2, precision="bf16-mixed")
    assert fabric.device == torch.device("hpu")
    assert fabric.strategy.parallel_devices == [torch.device("hpu")] * 2
    assert fabric.strategy.process_group_backend == "hccl"
    assert isinstance(fabric.strategy.precision, HPUPrecision)
    assert fabric.strategy.precision.device == "hpu"  # autocast on the HPU, not CUDA
    assert Fabric(accelerator="hpu").device == torch.device("hpu")


def test_on_a_gaudi_the_process_group_is_hccl(bridge_double: ModuleType, isolated_env: pytest.MonkeyPatch) -> None:
    for name in ("RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK", "LOCAL_WORLD_SIZE"):
        isolated_env.delenv(name, raising=False)
    isolated_env.setenv("MASTER_ADDR", "127.0.0.1")
    isolated_env.setenv("MASTER_PORT", str(find_free_network_port()))
    isolated_env.setenv("OMP_NUM_THREADS", "1")
    fabric = Fabric(accelerator="hpu", strategy="hpu_parallel", devices=1)
    try:
        fabric.launch()
        assert dist.get_backend() == "hccl"
        assert bridge_double.called("hccl.initialize_distributed_hpu")[0].kwargs == {
            "world_size": 1,
            "rank": 0,
            "local_rank": 0,
        }
        names = bridge_double.names()
        assert names.index("import hccl") < names.index("hccl.initialize_distributed_hpu")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_a_compiled_model_is_compiled_over_ddp(one_process_group: None) -> None:
    """Fabric unwraps a compiled model, lets the strategy wrap it in DDP, and compiles the wrapper again."""
    from torch._dynamo.eval_frame import OptimizedModule

    fabric = Fabric(accelerator="hpu", strategy="hpu_parallel", devices=1)
    fabric.launch()
    net = _net()
    compiled = torch.compile(net, backend=hpu.get_backend().compile_backend)
    model, optimizer = fabric.setup(compiled, torch.optim.SGD(net.parameters(), lr=0.1))
    assert isinstance(model._forward_module, OptimizedModule)
    assert isinstance(model._forward_module._orig_mod, DistributedDataParallel)
    before = _cpu_weights(net)
    _train(fabric, model, optimizer, steps=2)
    assert all(not torch.equal(before[name], tensor) for name, tensor in _cpu_weights(net).items())
