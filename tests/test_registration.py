"""Importing lightning_gaudi registers the HPU names with Lightning, idempotently."""

from __future__ import annotations

import importlib
import warnings

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.strategies import StrategyRegistry

import lightning_gaudi
from lightning_gaudi import (
    HPUAccelerator,
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
    hpu,
)

STRATEGIES = {
    "hpu_single": (SingleHPUStrategy, {}),
    "hpu_parallel": (HPUParallelStrategy, {}),
    "hpu_ddp": (HPUParallelStrategy, {}),
    "hpu_parallel_spawn": (HPUParallelStrategy, {"start_method": "spawn"}),
    "hpu_parallel_find_unused_parameters_true": (HPUParallelStrategy, {"find_unused_parameters": True}),
    "hpu_parallel_static_graph": (HPUParallelStrategy, {"static_graph": True}),
    "hpu_fsdp": (HPUFSDPStrategy, {}),
    "hpu_fsdp_sharded_checkpoint": (HPUFSDPStrategy, {"state_dict_type": "sharded"}),
    "hpu_model_parallel": (HPUModelParallelStrategy, {}),
}
#: Registered whether or not DeepSpeed is installed (built in tests/strategies/test_deepspeed.py, which needs it).
DEEPSPEED_STRATEGIES = {
    "hpu_deepspeed": (HPUDeepSpeedStrategy, {}),
    **{f"hpu_deepspeed_stage_{stage}": (HPUDeepSpeedStrategy, {"stage": stage}) for stage in (1, 2, 3)},
}


def test_names_are_registered() -> None:
    assert AcceleratorRegistry["hpu"]["accelerator"] is HPUAccelerator
    for name, (cls, init_params) in {**STRATEGIES, **DEEPSPEED_STRATEGIES}.items():
        assert StrategyRegistry[name]["strategy"] is cls, name
        assert StrategyRegistry[name]["init_params"] == init_params, name


def test_registering_again_is_harmless() -> None:
    before_accelerators = set(AcceleratorRegistry)
    before_strategies = set(StrategyRegistry)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        lightning_gaudi.register()
        lightning_gaudi.register()
        HPUAccelerator.register_accelerators(AcceleratorRegistry)
        HPUParallelStrategy.register_strategies(StrategyRegistry)
        SingleHPUStrategy.register_strategies(StrategyRegistry)
        importlib.import_module("lightning_gaudi")
    assert set(AcceleratorRegistry) == before_accelerators
    assert set(StrategyRegistry) == before_strategies
    test_names_are_registered()


#: The top-level names code outside the project uses; removing or renaming one breaks users.
PUBLIC = {
    "HPUAccelerator",
    "HPUCheckpointIO",
    "HPUDeepSpeedStrategy",
    "HPUFSDPPrecision",
    "HPUFSDPStrategy",
    "HPUModelParallelStrategy",
    "HPUParallelStrategy",
    "HPUPrecision",
    "RecipeCache",
    "Runtime",
    "SingleHPUStrategy",
    "configure",
    "fuse_optimizer",
    "register",
}


def test_public_api_is_exactly_the_documented_names() -> None:
    assert set(lightning_gaudi.__all__) == PUBLIC, "update PUBLIC, the README and the CHANGELOG together"
    for name in PUBLIC:
        obj = getattr(lightning_gaudi, name)
        assert (obj.__doc__ or "").strip(), f"lightning_gaudi.{name} has no docstring"


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_registered_names_build_a_trainer(eager_hpu: hpu.Backend, name: str) -> None:
    devices = 1 if name == "hpu_single" else 2
    trainer = Trainer(accelerator="hpu", strategy=name, devices=devices, logger=False)
    cls, init_params = STRATEGIES[name]
    assert type(trainer.strategy) is cls
    assert isinstance(trainer.accelerator, HPUAccelerator)
    for key, value in init_params.items():
        if key == "start_method":
            actual = trainer.strategy._start_method
        elif isinstance(getattr(type(trainer.strategy), key, None), property):
            actual = getattr(trainer.strategy, key)
        else:
            actual = trainer.strategy.ddp_kwargs[key]
        assert actual == value
