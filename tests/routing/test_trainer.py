"""The Trainer's routing policy (``lightning_gaudi/routing/trainer.py``): Lightning's strategy names and instances,
and ``strategy="auto"``, under ``accelerator="hpu"``, through the accelerator connector's wrappers."""

from __future__ import annotations

from typing import Any

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy

from lightning_gaudi import HPUAccelerator, HPUCheckpointIO, HPUParallelStrategy, SingleHPUStrategy, hpu


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("ddp", {"start_method": "popen", "find_unused_parameters": False}),
        ("ddp_spawn", {"start_method": "spawn", "find_unused_parameters": False}),
        ("ddp_find_unused_parameters_true", {"start_method": "popen", "find_unused_parameters": True}),
        ("ddp_find_unused_parameters_false", {"start_method": "popen", "find_unused_parameters": False}),
        ("ddp_spawn_find_unused_parameters_true", {"start_method": "spawn", "find_unused_parameters": True}),
        ("DDP", {"start_method": "popen", "find_unused_parameters": False}),  # Lightning lower-cases names
    ],
)
def test_lightning_ddp_names_run_the_hpu_strategy(eager_hpu: hpu.Backend, name: str, expected: dict[str, Any]) -> None:
    trainer = Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)
    strategy = trainer.strategy
    assert type(strategy) is HPUParallelStrategy
    assert strategy._start_method == expected["start_method"]
    assert strategy.ddp_kwargs["find_unused_parameters"] is expected["find_unused_parameters"]
    assert strategy.ddp_kwargs["gradient_as_bucket_view"] is True  # the HPU strategy's defaults, not Lightning's
    assert strategy._get_process_group_backend() == "hccl"
    assert isinstance(strategy.checkpoint_io, HPUCheckpointIO)


def test_lightning_ddp_name_under_auto_accelerator(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(strategy="ddp", devices=2, logger=False).strategy) is HPUParallelStrategy


def test_lightning_single_device_name_runs_the_hpu_strategy(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(accelerator="hpu", strategy="single_device", devices=1, logger=False).strategy) is (
        SingleHPUStrategy
    )


@pytest.mark.parametrize(
    "name",
    ["ddp_fork", "ddp_notebook", "ddp_fork_find_unused_parameters_true", "ddp_notebook_find_unused_parameters_false"],
)
def test_forking_ddp_names_are_refused_naming_the_hpu_ones(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` forks.*'hpu_parallel'.*'hpu_parallel_spawn'"):
        Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)


@pytest.mark.parametrize("name", ["xla", "xla_debug"])
def test_other_lightning_strategies_are_refused_naming_the_hpu_ones(eager_hpu: hpu.Backend, name: str) -> None:
    with pytest.raises(ValueError, match=rf"`strategy='{name}'` .* does not run on HPUs.*'hpu_parallel'"):
        Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)


def test_lightning_ddp_name_in_lazy_emulation_is_refused_as_hpu_parallel(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="'hpu_parallel' cannot run here: Lazy emulation drives one HPU"):
        Trainer(accelerator="hpu", strategy="ddp", devices=1, logger=False)


def test_a_ddp_instance_given_the_hpu_accelerator_is_adopted(eager_hpu: hpu.Backend) -> None:
    strategy = Trainer(strategy=DDPStrategy(accelerator=HPUAccelerator()), devices=2, logger=False).strategy
    assert type(strategy) is HPUParallelStrategy


def test_lightning_ddp_is_left_alone_on_other_accelerators(eager_hpu: hpu.Backend) -> None:
    assert type(Trainer(accelerator="cpu", strategy="ddp", devices=2, logger=False).strategy) is DDPStrategy


@pytest.mark.parametrize(
    ("strategy", "devices", "num_nodes"),
    [("hpu_single", 2, 1), ("hpu_single", "0,1", 1), ("single_device", 2, 1), ("hpu_single", 1, 2), (None, 2, 1)],
)
def test_single_hpu_strategy_with_several_devices_is_refused(
    eager_hpu: hpu.Backend, strategy: str | None, devices: Any, num_nodes: int
) -> None:
    with pytest.raises(ValueError, match=r"trains on one HPU, but the Trainer asks for .*strategy='hpu_parallel'"):
        Trainer(
            accelerator="hpu",
            strategy=SingleHPUStrategy() if strategy is None else strategy,
            devices=devices,
            num_nodes=num_nodes,
            logger=False,
        )


def test_single_hpu_strategy_with_auto_devices_takes_one(eager_hpu: hpu.Backend) -> None:
    assert eager_hpu.device_count() > 1
    trainer = Trainer(accelerator="hpu", strategy="hpu_single", logger=False)  # devices="auto"
    assert type(trainer.strategy) is SingleHPUStrategy
    assert trainer.num_devices == 1
    trainer = Trainer(accelerator="hpu", logger=False)  # strategy and devices "auto": every card, in parallel
    assert type(trainer.strategy) is HPUParallelStrategy
    assert trainer.num_devices == eager_hpu.device_count()


def test_an_unknown_hpu_name_is_refused_with_the_names_that_exist(eager_hpu: hpu.Backend) -> None:
    names = r"'hpu_deepspeed_stage_4'.*'hpu_deepspeed_stage_3'.*Did you mean 'hpu_deepspeed_stage_"
    with pytest.raises(ValueError, match=names):
        Trainer(accelerator="hpu", strategy="hpu_deepspeed_stage_4", devices=2)
    with pytest.raises(ValueError, match=r"Did you mean 'hpu_parallel'\?"):
        Trainer(accelerator="hpu", strategy="hpu_paralel", devices=2)
