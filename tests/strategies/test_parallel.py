"""hpu_single / hpu_parallel: automatic choice, registered variants, DDP arguments, reduce, and bad input."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.models import RegressionModel, make_net, regression_data, regression_loader, trainer_kwargs
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.fabric.utilities.distributed import ReduceOp
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.plugins import TorchSyncBatchNorm
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.strategies.launchers import _MultiProcessingLauncher, _SubprocessScriptLauncher

from lightning_gaudi import HPUCheckpointIO, HPUParallelStrategy, SingleHPUStrategy, hpu
from lightning_gaudi.distributed import rendezvous
from lightning_gaudi.emulator.sync_batchnorm import EmulatedSyncBatchNorm
from lightning_gaudi.strategies import HPUSyncBatchNorm

_needs_skip_all_reduce = pytest.mark.skipif(
    "skip_all_reduce_unused_params" not in torch.nn.parallel.DistributedDataParallel.__init__.__code__.co_varnames,
    reason=f"needs torch>=2.8: DDP's `skip_all_reduce_unused_params` is not in torch {torch.__version__}",
)


@pytest.mark.parametrize(
    ("devices", "num_nodes", "expected"),
    [
        (1, 1, SingleHPUStrategy),
        ([3], 1, SingleHPUStrategy),
        (2, 1, HPUParallelStrategy),
        ("0,1,2", 1, HPUParallelStrategy),
        (1, 2, HPUParallelStrategy),
    ],
)
def test_auto_strategy(eager_hpu: hpu.Backend, devices: Any, num_nodes: int, expected: type) -> None:
    trainer = Trainer(accelerator="hpu", devices=devices, num_nodes=num_nodes, logger=False)
    assert type(trainer.strategy) is expected
    assert isinstance(trainer.strategy.checkpoint_io, HPUCheckpointIO)
    if expected is HPUParallelStrategy:
        assert trainer.strategy.num_nodes == num_nodes
        assert trainer.strategy.world_size == len(trainer.strategy.parallel_devices) * num_nodes
        assert trainer.strategy._get_process_group_backend() == "hccl"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("hpu_parallel", {"find_unused_parameters": False, "static_graph": False}),
        ("hpu_ddp", {"find_unused_parameters": False, "static_graph": False}),
        ("hpu_parallel_find_unused_parameters_true", {"find_unused_parameters": True}),
        ("hpu_parallel_static_graph", {"static_graph": True}),
    ],
)
def test_registered_parallel_names(eager_hpu: hpu.Backend, name: str, expected: dict[str, bool]) -> None:
    trainer = Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUParallelStrategy
    assert isinstance(strategy.launcher, _SubprocessScriptLauncher)
    kwargs = strategy.ddp_kwargs
    assert kwargs["gradient_as_bucket_view"] is True  # Intel's advice, on by default
    for key, value in expected.items():
        assert kwargs[key] is value


def test_spawn_variant(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", strategy="hpu_parallel_spawn", devices=2, logger=False)
    assert isinstance(trainer.strategy.launcher, _MultiProcessingLauncher)
    assert trainer.strategy.launcher._start_method == "spawn"


def test_single_by_name(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", strategy="hpu_single", devices=1, logger=False)
    assert type(trainer.strategy) is SingleHPUStrategy
    assert trainer.strategy.root_device == torch.device("cpu")


@_needs_skip_all_reduce
def test_ddp_arguments_pass_through(eager_hpu: hpu.Backend) -> None:
    strategy = HPUParallelStrategy(
        bucket_cap_mb=100, static_graph=True, broadcast_buffers=False, skip_all_reduce_unused_params=True
    )
    assert strategy.ddp_kwargs == {
        "bucket_cap_mb": 100,
        "gradient_as_bucket_view": True,
        "static_graph": True,
        "find_unused_parameters": False,
        "broadcast_buffers": False,
        "skip_all_reduce_unused_params": True,
    }
    assert "bucket_cap_mb" not in HPUParallelStrategy().ddp_kwargs  # torch's default unless asked
    assert "broadcast_buffers" not in HPUParallelStrategy().ddp_kwargs  # deprecated in torch 2.13: not passed


@pytest.mark.parametrize("bucket_cap_mb", [0, -5, 0.0, "25", True, [25]])
def test_bad_bucket_cap_mb(eager_hpu: hpu.Backend, bucket_cap_mb: Any) -> None:
    with pytest.raises(ValueError, match=r"`bucket_cap_mb=.*` must be a positive number of megabytes"):
        HPUParallelStrategy(bucket_cap_mb=bucket_cap_mb)


@pytest.mark.parametrize(
    "knob",
    [{"broadcast_buffers": True}, {"static_graph": True}, {"find_unused_parameters": True}, {"ddp_comm_hook": print}],
)
def test_fast_ddp_refuses_what_only_the_ddp_wrapper_does(eager_hpu: hpu.Backend, knob: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=rf"`fast_ddp=True` .* takes no .*{next(iter(knob))}.*use fast_ddp=False"):
        HPUParallelStrategy(fast_ddp=True, **knob)
    HPUParallelStrategy(fast_ddp=True, broadcast_buffers=False)  # what fast_ddp does anyway


def test_fast_ddp_refuses_a_parameter_without_a_gradient(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    strategy = HPUParallelStrategy(fast_ddp=True)
    used, unused = torch.nn.Parameter(torch.ones(2)), torch.nn.Parameter(torch.ones(2))
    used.grad = torch.full((2,), 4.0)
    monkeypatch.setattr(dist, "get_world_size", lambda: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda flat: flat.mul_(2))  # the other rank's gradients are the same
    strategy._fast_buckets = [[used]]
    strategy._after_backward()
    torch.testing.assert_close(used.grad, torch.full((2,), 4.0))
    strategy._fast_buckets = [[used, unused]]
    with pytest.raises(RuntimeError, match="a parameter got no gradient on this rank"):
        strategy._after_backward()


def test_bad_start_method(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"start_method='fork'.*'popen' or 'spawn'"):
        HPUParallelStrategy(start_method="fork")  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", ["hpu_parallel", "hpu_single", "hpu_ddp"])
def test_hpu_strategy_with_another_accelerator(eager_hpu: hpu.Backend, strategy: str) -> None:
    with pytest.raises(ValueError, match=r"runs on HPUs, but the accelerator is CPUAccelerator.*accelerator='hpu'"):
        Trainer(accelerator="cpu", strategy=strategy, devices=2 if strategy != "hpu_single" else 1)


def test_lazy_emulation_has_one_device(lazy_hpu: hpu.Backend) -> None:
    """Lazy emulation reports the one device it can drive, so the defaults pick hpu_single instead of failing."""
    assert lazy_hpu.device_count() == 1
    trainer = Trainer(accelerator="hpu", logger=False)  # devices="auto"
    assert type(trainer.strategy) is SingleHPUStrategy
    assert trainer.strategy.root_device.type == "lazy"
    with pytest.raises(ValueError, match=r"asks for 2 HPUs but this node has 1.*Lazy emulation drives one HPU.*=eager"):
        Trainer(accelerator="hpu", devices=2, logger=False)


def test_parallel_refused_under_lazy_emulation(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="cannot run here: Lazy emulation drives one HPU"):
        Trainer(accelerator="hpu", strategy="hpu_parallel", devices=1, logger=False)


def test_reduce_mean_is_sum_over_world_size(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """HCCL has no mean: the strategy all-reduces with SUM and divides; a second rank is simulated by doubling."""
    ops: list[Any] = []
    layout_checks: list[list[int]] = []

    def all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None) -> None:
        ops.append(op)
        tensor.mul_(2)

    def all_gather(rows: list[torch.Tensor], tensor: torch.Tensor, group: Any = None) -> None:
        layout_checks.append(tensor.tolist())  # the layout check before a non-scalar reduce; the peer agrees
        for row in rows:
            row.copy_(tensor)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    monkeypatch.setattr(dist, "all_gather", all_gather)
    strategy = HPUParallelStrategy()

    result = strategy.reduce(torch.tensor([1.0, 3.0]), reduce_op="mean")
    torch.testing.assert_close(result, torch.tensor([1.0, 3.0]))
    result = strategy.reduce(torch.tensor([1, 3]), reduce_op=ReduceOp.AVG)
    assert result.dtype == torch.float32
    torch.testing.assert_close(result, torch.tensor([1.0, 3.0]))
    torch.testing.assert_close(strategy.reduce(torch.tensor([1.0]), reduce_op=None), torch.tensor([1.0]))
    torch.testing.assert_close(strategy.reduce(torch.tensor([1.0]), reduce_op="sum"), torch.tensor([2.0]))
    strategy.reduce(torch.tensor([1.0]), reduce_op="max")
    assert ops == [ReduceOp.SUM, ReduceOp.SUM, ReduceOp.SUM, ReduceOp.SUM, ReduceOp.MAX]
    assert [row[:2] for row in layout_checks] == [[1, 2], [1, 2]]  # (ndim, numel) of the two 2-element tensors
    assert strategy.reduce(3.0) == 3.0  # not a tensor: returned as is
    with pytest.raises(ValueError, match=r"`reduce_op='median'` is not a reduction; use 'mean', 'sum'"):
        strategy.reduce(torch.tensor([1.0]), reduce_op="median")


def test_lazy_single_device_fit(lazy_hpu: hpu.Backend) -> None:
    """Lazy emulation trains end to end on device "lazy", to the same weights as plain CPU SGD."""
    seed_everything(0, verbose=False)
    model = RegressionModel()
    initial = {name: tensor.clone() for name, tensor in model.net.state_dict().items()}
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(max_steps=3))
    assert isinstance(trainer.strategy, SingleHPUStrategy)
    assert trainer.strategy.root_device.type == "lazy"
    trainer.fit(model)
    assert trainer.global_step == 3
    assert model.seen["param_device"] == "lazy"
    assert model.seen["input_device"] == "lazy"

    net = make_net()
    net.load_state_dict(initial)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    x, y = regression_data(32)
    for step in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(x[4 * step : 4 * step + 4]), y[4 * step : 4 * step + 4]).backward()
        optimizer.step()
    for name, tensor in net.state_dict().items():
        torch.testing.assert_close(model.net.state_dict()[name].cpu(), tensor, rtol=1e-5, atol=1e-6)


def test_lazy_emulation_evaluates_with_default_inference_mode(lazy_hpu: hpu.Backend) -> None:
    """LTC cannot trace under torch.inference_mode; the strategy switches evaluation to no_grad by itself."""

    class Evaluated(RegressionModel):
        def validation_step(self, batch: Any, batch_idx: int) -> None:
            self.log("val_loss", self.training_step(batch, batch_idx))

    model = Evaluated()
    trainer = Trainer(accelerator="hpu", devices=1, **trainer_kwargs(limit_val_batches=2))
    assert trainer.validate_loop.inference_mode  # the user's (default) setting
    [metrics] = trainer.validate(model, dataloaders=regression_loader(8), verbose=False)
    assert all(not loop.inference_mode for loop in (trainer.validate_loop, trainer.test_loop, trainer.predict_loop))
    assert set(metrics) == {"val_loss"}


def test_multi_node_under_torchrun(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under torchrun Lightning's cluster environment supplies the ranks; no process is started by the Trainer."""
    torchrun = {
        "TORCHELASTIC_RUN_ID": "test",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29515",
        "WORLD_SIZE": "4",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    for name, value in torchrun.items():
        monkeypatch.setenv(name, value)
    trainer = Trainer(accelerator="hpu", devices=2, num_nodes=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUParallelStrategy
    assert type(strategy.cluster_environment) is TorchElasticEnvironment
    assert strategy.cluster_environment.creates_processes_externally
    assert (strategy.world_size, strategy.global_rank, strategy.local_rank, strategy.node_rank) == (4, 3, 1, 1)


# ----------------------------------------------------------------------------------------------------------------------
# "hpu" devices in emulation
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("given", [torch.device("hpu"), torch.device("hpu", 1), "hpu"])
def test_hpu_parallel_devices_mean_the_emulated_device(eager_hpu: hpu.Backend, given: Any) -> None:
    strategy = HPUParallelStrategy(parallel_devices=[torch.device(given)] * 2)
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=2, logger=False)
    assert trainer.strategy is strategy
    assert strategy.root_device == torch.device("cpu")
    assert trainer.strategy.determine_ddp_device_ids() is None  # a CPU module for torch's DDP
    trainer.strategy.accelerator.setup_device(strategy.root_device)  # what Strategy.setup_environment does


@pytest.mark.parametrize("given", [torch.device("hpu"), "hpu", "hpu:0", 0])
def test_single_hpu_device_means_the_emulated_device(lazy_hpu: hpu.Backend, given: Any) -> None:
    trainer = Trainer(accelerator="hpu", strategy=SingleHPUStrategy(device=given), devices=1, logger=False)
    assert trainer.strategy.root_device.type == "lazy"
    trainer.strategy.accelerator.setup_device(trainer.strategy.root_device)


def test_hpu_devices_stay_hpu_devices_on_a_gaudi(bridge_double: Any) -> None:
    assert HPUParallelStrategy(parallel_devices=[torch.device("hpu")] * 2).root_device == torch.device("hpu")
    assert SingleHPUStrategy(device="hpu").root_device == torch.device("hpu")


@pytest.mark.parametrize("given", [torch.device("cuda"), "cuda:0", "meta"])
def test_a_device_that_is_not_an_hpu_is_refused(eager_hpu: hpu.Backend, given: Any) -> None:
    with pytest.raises(ValueError, match=r"SingleHPUStrategy got device .*; pass an HPU device"):
        SingleHPUStrategy(device=given).root_device  # noqa: B018
    with pytest.raises(ValueError, match=r"HPUParallelStrategy got device .*; pass an HPU device"):
        HPUParallelStrategy(parallel_devices=[torch.device(given)]).root_device  # noqa: B018


def test_a_device_that_is_not_an_hpu_fails_while_the_trainer_is_built(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"SingleHPUStrategy got device meta; pass an HPU device"):
        Trainer(accelerator="hpu", strategy=SingleHPUStrategy(device="meta"), devices=1, logger=False)
    with pytest.raises(ValueError, match=r"HPUParallelStrategy got device meta; pass an HPU device"):
        Trainer(
            accelerator="hpu",
            strategy=HPUParallelStrategy(parallel_devices=[torch.device("meta")] * 2),
            devices=2,
            logger=False,
        )


# ----------------------------------------------------------------------------------------------------------------------
# Reductions HCCL has
# ----------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reduce_op", "op"),
    [
        ("sum", ReduceOp.SUM),
        ("MAX", ReduceOp.MAX),
        (ReduceOp.MIN, ReduceOp.MIN),
        ("product", ReduceOp.PRODUCT),
        ("PRODUCT", ReduceOp.PRODUCT),
        (ReduceOp.PRODUCT, ReduceOp.PRODUCT),
        ("mean", ReduceOp.SUM),  # HCCL has no AVG: a sum, then a division
        (None, ReduceOp.SUM),
        (ReduceOp.AVG, ReduceOp.SUM),
    ],
)
def test_reductions_reach_hccl_as_ops_it_has(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, reduce_op: Any, op: Any
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: 2)
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op, group=None: calls.append(op))
    result = HPUParallelStrategy().reduce(torch.tensor([2.0]), reduce_op=reduce_op)
    assert calls == [op]
    assert result.item() == (1.0 if op == ReduceOp.SUM and reduce_op in ("mean", None, ReduceOp.AVG) else 2.0)


@pytest.mark.parametrize("reduce_op", [ReduceOp.BAND, ReduceOp.BOR, ReduceOp.BXOR, "band", "premul_sum"])
def test_reductions_hccl_lacks_are_refused(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, reduce_op: Any
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "all_reduce", lambda *args, **kwargs: calls.append(args))
    with pytest.raises(ValueError, match=r"is not supported on HPU: HCCL reduces with sum, min, max and product"):
        HPUParallelStrategy().reduce(torch.tensor([2.0]), reduce_op=reduce_op)
    assert calls == []  # refused before any collective, in emulation as on a Gaudi
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    with pytest.raises(ValueError, match=r"is not supported on HPU"):  # and in a single process, before it scales out
        HPUParallelStrategy().reduce(torch.tensor([2.0]), reduce_op=reduce_op)


# ----------------------------------------------------------------------------------------------------------------------
# DDP arguments checked when the strategy is built
# ----------------------------------------------------------------------------------------------------------------------


@_needs_skip_all_reduce
def test_a_misspelled_ddp_argument_is_refused_with_a_suggestion(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'bucket_cap_mbb'.*Did you mean 'bucket_cap_mb'"):
        HPUParallelStrategy(bucket_cap_mbb=3)
    with pytest.raises(TypeError, match=r"'find_unused_parameter'.*Did you mean 'find_unused_parameters'"):
        HPUParallelStrategy(find_unused_parameter=True)
    with pytest.raises(TypeError, match=r"'zzz'.*DistributedDataParallel takes: .*skip_all_reduce_unused_params"):
        HPUParallelStrategy(zzz=1)


@pytest.mark.parametrize("name", ["module", "device_ids"])
def test_ddp_arguments_the_strategy_sets_are_refused(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(TypeError, match=rf"`{name}` is set by HPUParallelStrategy itself"):
        HPUParallelStrategy(**{name: None})


@pytest.mark.parametrize("bucket_cap_mb", [float("inf"), float("nan"), -float("inf")])
def test_bucket_cap_mb_must_be_finite(eager_hpu: hpu.Backend, bucket_cap_mb: float) -> None:
    with pytest.raises(ValueError, match=r"`bucket_cap_mb=.*` must be a positive number of megabytes"):
        HPUParallelStrategy(bucket_cap_mb=bucket_cap_mb)


# ----------------------------------------------------------------------------------------------------------------------
# Start-up lines
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def lightning_log() -> Iterator[list[str]]:
    """What Lightning's loggers write (they do not propagate to the root logger that caplog watches)."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("lightning.pytorch")
    logger.addHandler(handler)
    yield lines
    logger.removeHandler(handler)


def _set_up_distributed(monkeypatch: pytest.MonkeyPatch) -> HPUParallelStrategy:
    """Builds an hpu_parallel Trainer for 2 devices and runs its process-group set-up with torch's call recorded."""
    formed: list[dict[str, Any]] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: bool(formed))
    monkeypatch.setattr(rendezvous, "init_process_group", lambda backend, **kwargs: formed.append(kwargs))
    strategy = Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, logger=False).strategy
    assert isinstance(strategy, HPUParallelStrategy)
    strategy.setup_distributed()
    assert len(formed) == 1
    return strategy


def test_start_up_lines_in_emulation(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, lightning_log: list[str]
) -> None:
    _set_up_distributed(monkeypatch)
    text = "\n".join(lightning_log)
    assert (
        "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2 on HPU 0 of node 0"
        " (GAUDI2 emulated on the CPU (eager mode), device cpu)" in text
    )
    assert "distributed_backend=hccl\nAll distributed processes registered. Starting with 2 processes\n" in text
    assert "HPUs: 2 per node x 1 node(s), GAUDI2 emulated on the CPU (eager mode), HCCL emulated over gloo" in text


def test_start_up_lines_on_a_gaudi(
    bridge_double: Any, monkeypatch: pytest.MonkeyPatch, lightning_log: list[str]
) -> None:
    _set_up_distributed(monkeypatch)
    text = "\n".join(lightning_log)
    assert "Initializing distributed: GLOBAL_RANK: 0, MEMBER: 1/2 on HPU 0 of node 0 (GAUDI2, device hpu)" in text
    assert "distributed_backend=hccl\nAll distributed processes registered. Starting with 2 processes\n" in text
    assert "HPUs: 2 per node x 1 node(s), GAUDI2\n" in text


# ----------------------------------------------------------------------------------------------------------------------
# sync_batchnorm (the 2-process run is in tests/strategies/test_parallel_emulated.py)
# ----------------------------------------------------------------------------------------------------------------------


def test_sync_batchnorm_layers_in_emulation(eager_hpu: hpu.Backend) -> None:
    model = HPUSyncBatchNorm().apply(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)))
    assert type(model[1]) is EmulatedSyncBatchNorm  # torch's SyncBatchNorm refuses CPU modules
    assert type(HPUSyncBatchNorm().revert(model)[1]) is torch.nn.BatchNorm1d


def test_sync_batchnorm_layers_on_a_gaudi(bridge_double: Any) -> None:
    model = HPUSyncBatchNorm().apply(torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3)))
    assert type(model[1]) is torch.nn.SyncBatchNorm  # Intel's bridge runs torch's module on the HPU


def test_sync_batchnorm_is_the_hpu_one_when_the_strategy_sets_up(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[Any] = []
    monkeypatch.setattr(DDPStrategy, "setup", lambda self, trainer: seen.append(self._layer_sync))
    trainer = Trainer(accelerator="hpu", strategy="hpu_parallel", devices=2, sync_batchnorm=True, logger=False)
    assert type(trainer.strategy._layer_sync) is TorchSyncBatchNorm  # what Lightning's connector hands over
    trainer.strategy.setup(trainer)
    assert [type(layer_sync) for layer_sync in seen] == [HPUSyncBatchNorm]
