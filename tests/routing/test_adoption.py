"""Strategy objects built by other code (``lightning_gaudi/strategies/adoption.py`` through the routing): an instance
of a Lightning strategy class, or of a third party's subclass of one, runs on the HPU strategy standing in for it,
with the arguments read back from the object, and stays an instance of its own class."""

from __future__ import annotations

import inspect
import logging
import pickle
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning.fabric.strategies as fabric_strategies
import lightning.pytorch.strategies as trainer_strategies
import pytest
import torch
from helpers.models import Evaluated, regression_loader, trainer_kwargs
from lightning.fabric import Fabric
from lightning.pytorch import Trainer, seed_everything
from torch.distributed.fsdp import ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

import lightning_gaudi
import lightning_gaudi.fabric as hpu_fabric
from lightning_gaudi import hpu
from lightning_gaudi.strategies.adoption import read_arguments
from lightning_gaudi.strategies.deepspeed import DEEPSPEED_AVAILABLE


def _trainer(strategy: Any, devices: int = 2, **kwargs: Any) -> Trainer:
    return Trainer(accelerator="hpu", strategy=strategy, devices=devices, logger=False, **kwargs)


def test_ddp_object_runs_on_hpu_parallel_with_its_arguments(
    eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture
) -> None:
    given = trainer_strategies.DDPStrategy(bucket_cap_mb=5, static_graph=True, timeout=timedelta(seconds=42))
    with caplog.at_level(logging.INFO):
        strategy = _trainer(given).strategy
    assert type(strategy) is lightning_gaudi.HPUParallelStrategy  # Lightning's class itself: its HPU stand-in
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 5
    assert strategy.ddp_kwargs["static_graph"] is True
    assert strategy.ddp_kwargs["gradient_as_bucket_view"] is True  # not given: the HPU strategy's default
    assert strategy.timeout == timedelta(seconds=42)
    assert strategy._get_process_group_backend() == "hccl"
    assert isinstance(strategy.checkpoint_io, lightning_gaudi.HPUCheckpointIO)
    assert (
        "`strategy=DDPStrategy(...)` with accelerator='hpu': training with DDPStrategy on HPUParallelStrategy("
        "timeout=datetime.timedelta(seconds=42), bucket_cap_mb=5, static_graph=True)." in caplog.text
    )


class ThirdPartyDDP(trainer_strategies.DDPStrategy):
    """A library's subclass (as Ray's ``RayDDPStrategy``): its own arguments, attributes and overrides."""

    def __init__(self, tag: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tag = tag

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank, "tag": self.tag}


def test_a_subclass_object_stays_an_instance_of_its_class_on_the_hpu_strategy(eager_hpu: hpu.Backend) -> None:
    strategy = _trainer(ThirdPartyDDP("mine", find_unused_parameters=True)).strategy
    assert isinstance(strategy, ThirdPartyDDP)  # what a library checks (Ray's prepare_trainer)
    assert isinstance(strategy, lightning_gaudi.HPUParallelStrategy)
    assert type(strategy).__name__ == "ThirdPartyDDP"
    mro = type(strategy).__mro__
    assert mro.index(ThirdPartyDDP) < mro.index(lightning_gaudi.HPUParallelStrategy)  # its overrides first
    assert mro.index(lightning_gaudi.HPUParallelStrategy) < mro.index(trainer_strategies.DDPStrategy)
    assert strategy.tag == "mine"
    assert strategy.distributed_sampler_kwargs["tag"] == "mine"
    assert strategy.ddp_kwargs["find_unused_parameters"] is True
    copy = pickle.loads(pickle.dumps(strategy))  # a spawned rank receives it pickled
    assert type(copy) is type(strategy)
    assert copy.tag == "mine"
    assert copy.ddp_kwargs == strategy.ddp_kwargs


def test_fsdp_object_built_as_litgpt_builds_it(eager_hpu: hpu.Backend) -> None:
    given = trainer_strategies.FSDPStrategy(
        auto_wrap_policy={torch.nn.Linear},
        activation_checkpointing_policy={torch.nn.Linear},
        state_dict_type="sharded",
        sharding_strategy="SHARD_GRAD_OP",
        limit_all_gathers=True,
        cpu_offload=False,
    )
    strategy = _trainer(given).strategy
    assert type(strategy) is lightning_gaudi.HPUFSDPStrategy
    assert strategy.sharding_strategy is ShardingStrategy.SHARD_GRAD_OP
    assert strategy.state_dict_type == "sharded"
    assert strategy.kwargs["limit_all_gathers"] is True
    assert isinstance(strategy.kwargs["auto_wrap_policy"], ModuleWrapPolicy)
    assert strategy._activation_checkpointing_kwargs is given._activation_checkpointing_kwargs
    assert strategy.cpu_offload.offload_params is False


def test_fsdp_object_with_cpu_offload_is_refused_saying_where_it_came_from(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(
        ValueError, match=r"FSDPStrategy\(\.\.\.\)` runs on HPUs as HPUFSDPStrategy.*CPU offload is not"
    ):
        _trainer(trainer_strategies.FSDPStrategy(cpu_offload=True))


def test_ddp_object_arguments_without_hpu_meaning_are_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"model_averaging_period=4.*post-local SGD.*not offered on HPUs"):
        _trainer(trainer_strategies.DDPStrategy(model_averaging_period=4))
    with pytest.raises(ValueError, match=r"`strategy=DDPStrategy\(...\)` runs on HPUs.*start_method='fork'"):
        _trainer(trainer_strategies.DDPStrategy(start_method="fork"))


@pytest.mark.skipif(not DEEPSPEED_AVAILABLE, reason="DeepSpeed is not installed (the `deepspeed` extra)")
def test_deepspeed_object_runs_with_its_config(eager_hpu: hpu.Backend) -> None:
    given = trainer_strategies.DeepSpeedStrategy(stage=3, allgather_bucket_size=1234, loss_scale=8.0)
    strategy = _trainer(given).strategy
    assert type(strategy) is lightning_gaudi.HPUDeepSpeedStrategy
    assert strategy.config["zero_optimization"]["stage"] == 3
    assert strategy.config["zero_optimization"]["allgather_bucket_size"] == 1234
    assert strategy.zero_stage_3
    assert strategy.loss_scale == 8.0


def test_model_parallel_object(eager_hpu: hpu.Backend) -> None:
    strategy = _trainer(trainer_strategies.ModelParallelStrategy(tensor_parallel_size=2)).strategy
    assert type(strategy) is lightning_gaudi.HPUModelParallelStrategy
    assert strategy._tensor_parallel_size == 2
    assert strategy._data_parallel_size == "auto"


def test_single_device_object_of_a_gpu_script_takes_this_processs_card(eager_hpu: hpu.Backend) -> None:
    strategy = _trainer(trainer_strategies.SingleDeviceStrategy(device="cpu"), devices=1).strategy
    assert type(strategy) is lightning_gaudi.SingleHPUStrategy
    assert strategy.root_device == eager_hpu.device(0)


def test_objects_are_left_alone_on_other_accelerators(eager_hpu: hpu.Backend) -> None:
    given = trainer_strategies.DDPStrategy()
    assert Trainer(accelerator="cpu", strategy=given, devices=2, logger=False).strategy is given


def test_an_object_under_auto_accelerator_is_adopted(eager_hpu: hpu.Backend) -> None:
    strategy = Trainer(strategy=ThirdPartyDDP("auto"), devices=2, logger=False).strategy
    assert isinstance(strategy, lightning_gaudi.HPUParallelStrategy)


def test_fabric_objects_run_on_the_fabric_hpu_strategies(eager_hpu: hpu.Backend) -> None:
    ddp = Fabric(accelerator="hpu", devices=2, strategy=fabric_strategies.DDPStrategy(bucket_cap_mb=7)).strategy
    assert type(ddp) is hpu_fabric.HPUParallelStrategy
    assert ddp.ddp_kwargs["bucket_cap_mb"] == 7
    fsdp = Fabric(
        accelerator="hpu", devices=2, strategy=fabric_strategies.FSDPStrategy(state_dict_type="full")
    ).strategy
    assert type(fsdp) is hpu_fabric.HPUFSDPStrategy
    assert fsdp._state_dict_type == "full"

    def parallelize(module: torch.nn.Module, mesh: Any) -> torch.nn.Module:
        return module

    mp = Fabric(
        accelerator="hpu", devices=2, strategy=fabric_strategies.ModelParallelStrategy(parallelize, 1, 2)
    ).strategy
    assert type(mp) is hpu_fabric.HPUModelParallelStrategy
    assert mp._parallelize_fn is parallelize
    assert (mp._data_parallel_size, mp._tensor_parallel_size) == (1, 2)
    single = Fabric(accelerator="hpu", devices=1, strategy=fabric_strategies.SingleDeviceStrategy("cpu")).strategy
    assert type(single) is hpu_fabric.SingleHPUStrategy


def test_fabric_deepspeed_object_is_refused_with_the_reason(eager_hpu: hpu.Backend) -> None:
    if not DEEPSPEED_AVAILABLE:
        pytest.skip("DeepSpeed is not installed (the `deepspeed` extra)")
    with pytest.raises(
        ValueError, match=r"DeepSpeedStrategy\(\.\.\.\)` does not run on HPUs: lightning_gaudi.fabric has"
    ):
        Fabric(accelerator="hpu", devices=2, strategy=fabric_strategies.DeepSpeedStrategy())


def _non_default(name: str, parameter: inspect.Parameter) -> Any:
    """A value Lightning keeps as given (a distinct object), for the arguments it stores unchanged."""
    return {"timeout": timedelta(seconds=7), "process_group_backend": "gloo", "start_method": "spawn"}.get(
        name, object()
    )


_STORED_AS_GIVEN = {
    trainer_strategies.DDPStrategy: ("cluster_environment", "process_group_backend", "timeout", "start_method"),
    fabric_strategies.DDPStrategy: ("cluster_environment", "process_group_backend", "timeout", "start_method"),
    trainer_strategies.FSDPStrategy: ("cluster_environment", "mixed_precision", "process_group_backend", "timeout"),
    fabric_strategies.FSDPStrategy: ("cluster_environment", "mixed_precision", "process_group_backend", "timeout"),
    trainer_strategies.ModelParallelStrategy: ("process_group_backend", "timeout"),
    fabric_strategies.ModelParallelStrategy: ("parallelize_fn", "process_group_backend", "timeout"),
}


@pytest.mark.parametrize(
    "lightning_cls", list(_STORED_AS_GIVEN), ids=lambda c: f"{c.__module__.split('.')[1]}-{c.__name__}"
)
def test_canary_every_argument_is_read_back_from_lightnings_object(eager_hpu: hpu.Backend, lightning_cls: type) -> None:
    """Fails when Lightning keeps an argument of its strategy classes somewhere the adoption does not look."""
    hpu_cls = next(
        c
        for c in (*vars(lightning_gaudi).values(), *vars(hpu_fabric).values())
        if isinstance(c, type) and lightning_cls in vars(c).get("lightning_counterparts", ())
    )
    given = {
        name: _non_default(name, p)
        for name, p in inspect.signature(lightning_cls.__init__).parameters.items()
        if name in _STORED_AS_GIVEN[lightning_cls]
    }
    if "parallelize_fn" not in given and lightning_cls is fabric_strategies.ModelParallelStrategy:
        given["parallelize_fn"] = object()
    read = read_arguments(lightning_cls(**given), lightning_cls, hpu_cls.adoption)
    for name, value in given.items():
        assert read[name] is value, name
    readable = set(inspect.signature(lightning_cls.__init__).parameters) - {"self", "kwargs"} - hpu_cls.adoption.folded
    assert readable <= set(read)


def _single_fit(strategy: Any, tmp_path: Path, steps: int, ckpt: Path | None = None) -> dict[str, Any]:
    seed_everything(0, verbose=False)
    model = Evaluated()
    trainer = Trainer(accelerator="hpu", devices=1, strategy=strategy, **trainer_kwargs(max_steps=steps))
    loader = regression_loader(samples=8, batch_size=4)
    trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt)
    if ckpt is None:
        trainer.save_checkpoint(tmp_path / "first.ckpt")
    return {
        "weights": {name: tensor.tolist() for name, tensor in model.state_dict().items()},
        "validate": trainer.validate(model, loader, verbose=False),
        "test": trainer.test(model, loader, verbose=False),
        "predict": [rows.tolist() for rows in trainer.predict(model, loader)],
        "strategy": type(trainer.strategy),
    }


def test_single_device_object_equals_hpu_single_through_fit_resume_and_evaluation(
    eager_hpu: hpu.Backend, tmp_path: Path
) -> None:
    by_name = _single_fit("hpu_single", tmp_path / "name", 2)
    as_object = _single_fit(trainer_strategies.SingleDeviceStrategy("cuda:0"), tmp_path / "object", 2)
    assert as_object["strategy"] is lightning_gaudi.SingleHPUStrategy
    assert {k: v for k, v in as_object.items() if k != "strategy"} == {
        k: v for k, v in by_name.items() if k != "strategy"
    }
    resumed_name = _single_fit("hpu_single", tmp_path / "name", 4, ckpt=tmp_path / "name" / "first.ckpt")
    resumed_object = _single_fit(
        trainer_strategies.SingleDeviceStrategy("cuda:0"),
        tmp_path / "object",
        4,
        ckpt=tmp_path / "object" / "first.ckpt",
    )
    assert resumed_object["weights"] == resumed_name["weights"]


@pytest.fixture
def notebook(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interactive session, as a Jupyter kernel or ``python -i`` (Python sets ``sys.ps1`` there)."""
    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)


def test_a_bare_trainer_in_a_notebook_uses_one_of_the_cards(
    eager_hpu: hpu.Backend, notebook: None, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        trainer = Trainer(logger=False)
    assert isinstance(trainer.accelerator, lightning_gaudi.HPUAccelerator)
    assert trainer.num_devices == 1
    assert type(trainer.strategy) is lightning_gaudi.SingleHPUStrategy
    assert "Trainer will use only 1 of 8 HPUs because it runs in an interactive session" in caplog.text
    fabric = Fabric()
    assert type(fabric.strategy) is hpu_fabric.SingleHPUStrategy


@pytest.mark.parametrize("api", ["Trainer", "Fabric"])
def test_several_devices_in_a_notebook_are_refused_naming_what_works(
    eager_hpu: hpu.Backend, notebook: None, api: str
) -> None:
    build = (
        (lambda: Trainer(accelerator="hpu", devices=2, logger=False))
        if api == "Trainer"
        else (lambda: Fabric(accelerator="hpu", devices=2))
    )
    with pytest.raises(ValueError, match=r"devices=2.*interactive session.*Run the training as a script.*devices=1"):
        build()


def _fabric_single(strategy: Any, tmp_path: Path) -> dict[str, Any]:
    fabric = Fabric(accelerator="hpu", devices=1, strategy=strategy)
    fabric.seed_everything(0, verbose=False)
    model = torch.nn.Linear(4, 1)
    model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(2):
        fabric.backward(torch.nn.functional.mse_loss(model(x.to(fabric.device)), y.to(fabric.device)))
        optimizer.step()
        optimizer.zero_grad()
    fabric.save(tmp_path / "state.ckpt", {"model": model, "optimizer": optimizer})
    restored = {"model": model, "optimizer": optimizer}
    fabric.load(tmp_path / "state.ckpt", restored)
    return {"type": type(fabric.strategy), "weights": {k: v.tolist() for k, v in model.state_dict().items()}}


def test_fabric_single_device_object_equals_hpu_single(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    by_name = _fabric_single("hpu_single", tmp_path / "name")
    as_object = _fabric_single(fabric_strategies.SingleDeviceStrategy("cuda:0"), tmp_path / "object")
    assert as_object["type"] is hpu_fabric.SingleHPUStrategy
    assert as_object["weights"] == by_name["weights"]
