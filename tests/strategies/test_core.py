"""The shared HPU strategy core (``lightning_gaudi/strategies/core.py``): every strategy, the Trainer's and Fabric's,
gets its HPU behaviour from it (none re-implements it), behaves the same on failure and preemption, and says what runs
in one start-up line."""

from __future__ import annotations

import argparse
import logging
import re
import signal
import sys
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_only

import lightning_gaudi
from lightning_gaudi import fabric, hpu
from lightning_gaudi.strategies import core
from lightning_gaudi.strategies.core import HPUParallelCore, HPUStrategyCore, TrainerParallelCore

TRAINER_DISTRIBUTED = (
    lightning_gaudi.HPUParallelStrategy,
    lightning_gaudi.HPUFSDPStrategy,
    lightning_gaudi.HPUDeepSpeedStrategy,
    lightning_gaudi.HPUModelParallelStrategy,
)
ALL_STRATEGIES = (
    lightning_gaudi.SingleHPUStrategy,
    *TRAINER_DISTRIBUTED,
    fabric.SingleHPUStrategy,
    fabric.HPUParallelStrategy,
    fabric.HPUFSDPStrategy,
    fabric.HPUModelParallelStrategy,
)
#: What only the core may define: a strategy that defines one of these again has drifted from the others.
CORE_ONLY = (
    "accelerator",
    "timeout",
    "barrier",
    "broadcast",
    "all_gather",
    "backward",
    "reduce",
    "on_exception",
    "register_strategies",
    "set_world_ranks",
    "check_launch",
    "_get_process_group_backend",
    "model_to_device",
    "batch_to_device",
    "teardown",
    "training_step",
    "validation_step",
)


@pytest.mark.parametrize("cls", ALL_STRATEGIES, ids=lambda cls: f"{cls.__module__}.{cls.__name__}")
def test_every_strategy_takes_its_hpu_behaviour_from_the_core(cls: type) -> None:
    assert issubclass(cls, HPUStrategyCore)
    if "Single" not in cls.__name__:
        assert issubclass(cls, HPUParallelCore)
    again = sorted(name for name in CORE_ONLY if name in vars(cls))
    assert not again, f"{cls.__name__} re-implements the core's {again}: change the core instead"


@pytest.mark.parametrize("cls", TRAINER_DISTRIBUTED, ids=lambda cls: cls.__name__)
def test_a_failure_ends_the_launched_ranks_but_a_preemption_does_not(cls: type, eager_hpu: hpu.Backend) -> None:
    if cls is lightning_gaudi.HPUDeepSpeedStrategy:
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    strategy = cls()
    killed: list[int] = []
    strategy._launcher = SimpleNamespace(kill=killed.append)  # type: ignore[attr-defined]
    strategy.on_exception(SIGTERMException())
    assert killed == []
    error = RuntimeError("boom")
    strategy.on_exception(error)
    assert killed == [signal.SIGKILL]


@pytest.mark.parametrize("cls", TRAINER_DISTRIBUTED, ids=lambda cls: cls.__name__)
def test_every_distributed_strategy_refuses_another_accelerator_and_a_bad_timeout(
    cls: type, eager_hpu: hpu.Backend
) -> None:
    if cls is lightning_gaudi.HPUDeepSpeedStrategy:
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    from lightning.pytorch.accelerators import CPUAccelerator

    with pytest.raises(ValueError, match=r"runs on HPUs, but the accelerator is CPUAccelerator.*accelerator='hpu'"):
        cls(accelerator=CPUAccelerator())
    with pytest.raises(ValueError, match="timeout"):
        cls(timeout=-1)
    assert cls(timeout=12).timeout.total_seconds() == 12
    assert isinstance(cls(), TrainerParallelCore)


def test_the_deepspeed_engine_gets_the_local_rank_on_every_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning passes ``root_device.index`` (None on the HPU and the emulated CPU) as DeepSpeed's device rank, for
    training and for validate/test/predict alike; the strategy gives its local rank instead, and only within its
    ``init_deepspeed``."""
    calls: list[Any] = []
    fake = ModuleType("deepspeed")
    fake.initialize = lambda **kwargs: calls.append(kwargs["args"].device_rank)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    from lightning_gaudi.patches.deepspeed_strategy import device_rank

    original = fake.initialize  # type: ignore[attr-defined]
    with device_rank(3):
        fake.initialize(args=argparse.Namespace(device_rank=None))  # type: ignore[attr-defined]
        fake.initialize(args=argparse.Namespace(device_rank=1))  # type: ignore[attr-defined]
    assert calls == [3, 1]
    assert fake.initialize is original  # type: ignore[attr-defined]


# ----------------------------------------------------------------------------------------------------------------------
# The start-up line
# ----------------------------------------------------------------------------------------------------------------------


def _device_lines(caplog: pytest.LogCaptureFixture, **trainer_kwargs: Any) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.INFO):
        trainer = Trainer(
            logger=False, enable_checkpointing=False, enable_progress_bar=False, limit_val_batches=1, **trainer_kwargs
        )
        trainer.validate(BoringModel(), verbose=False)
        trainer.validate(BoringModel(), verbose=False)  # once per Trainer
    return [r.getMessage() for r in caplog.records if " available: " in r.getMessage()]


def test_one_line_after_lightnings_in_eager_emulation(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    lines = _device_lines(caplog, accelerator="hpu", devices=1)
    assert [line.split(":")[0] for line in lines] == ["GPU available", "TPU available", "HPU available"]
    assert re.match(
        r"HPU available: True \(GAUDI2, EMULATED on the CPU in eager mode, \d+ torch threads?\), using: 1 HPU,"
        r" strategy SingleHPUStrategy\.",
        lines[-1],
    ), lines[-1]
    assert f"Emulation ({hpu.EMULATE_ENV}=eager" in lines[-1]
    assert "numbers from this run are CPU numbers" in lines[-1]


def test_the_line_is_rank_zeros(
    eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    assert not [line for line in _device_lines(caplog, accelerator="hpu", devices=1) if "HPU" in line]


def test_the_line_in_lazy_emulation(lazy_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    line = _device_lines(caplog, accelerator="hpu")[-1]
    assert line.startswith("HPU available: True (GAUDI2, EMULATED on the CPU in lazy mode, ")
    assert "), using: 1 HPU, strategy SingleHPUStrategy." in line


def test_the_line_of_a_ddp_run(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    trainer = Trainer(accelerator="hpu", devices=2, strategy="hpu_parallel", logger=False)
    with caplog.at_level(logging.INFO):
        trainer.strategy._prepare_trainer(trainer)  # type: ignore[attr-defined]
    assert "using: 2 HPUs, strategy HPUParallelStrategy." in caplog.text


def test_a_gaudi_is_not_called_emulated(bridge_double: ModuleType, caplog: pytest.LogCaptureFixture) -> None:
    trainer = Trainer(accelerator="hpu", devices=1, logger=False)
    with caplog.at_level(logging.INFO):
        trainer.strategy._prepare_trainer(trainer)  # type: ignore[attr-defined]
    assert "HPU available: True (GAUDI2, lazy mode), using: 1 HPU, strategy SingleHPUStrategy" in caplog.text


def test_hpu_device_refuses_other_kinds(eager_hpu: hpu.Backend) -> None:
    assert core.hpu_device("hpu", "X") == eager_hpu.device(None)
    with pytest.raises(ValueError, match=r"X got device cuda:0; pass an HPU device"):
        core.hpu_device("cuda:0", "X")
    with pytest.raises(ValueError, match="which is not a device"):
        core.hpu_device("nonsense", "X")


# ----------------------------------------------------------------------------------------------------------------------
# The core's overrides still override: a Lightning base that renames or drops a method the core defines
# ----------------------------------------------------------------------------------------------------------------------

#: What each core mixin overrides on every Lightning base it is combined with (Trainer and Fabric).
CORE_OVERRIDES = {
    "HPUStrategyCore": {"__init__", "accelerator", "register_strategies"},
    "HPUParallelCore": {
        "__init__",
        "root_device",
        "_get_process_group_backend",
        "barrier",
        "broadcast",
        "all_gather",
        "backward",
        "distributed_sampler_kwargs",
        "_configure_launcher",
    },
    "TrainerCore": {
        "setup_environment",
        "model_to_device",
        "batch_to_device",
        "teardown",
        "on_exception",
        "load_checkpoint",
    },
    "TrainerParallelCore": {
        "set_world_ranks",
        "training_step",
        "validation_step",
        "test_step",
        "predict_step",
        "reduce",
        "setup",
    },
    "FabricCore": {
        "__init__",
        "setup_environment",
        "setup_module",
        "module_to_device",
        "setup_optimizer",
        "backward",
        "optimizer_step",
        "save_checkpoint",
        "load_checkpoint",
    },
    "DDPCore": {"optimizer_step"},
    "SingleDeviceCore": {"root_device"},
    "FSDPCore": set(),
    "ModelParallelCore": set(),
}
#: Overrides of a method only some bases have, by the bases that must have it.
PARTIAL_OVERRIDES = {("TrainerParallelCore", "setup_distributed"): {"DDPStrategy", "DeepSpeedStrategy"}}
#: The mixins' own methods (no Lightning base has them).
CORE_OWN = {
    "HPUStrategyCore": {"_check_runnable", "_hpu_device"},
    "HPUParallelCore": {
        "timeout",
        "_check_runnable",
        "check_launch",
        "_form_process_group",
        "_set_ranks",
        "_after_backward",
        "_all_reduce",
    },
    "TrainerCore": {"_prepare_trainer", "load_checkpoint_files"},
    "TrainerParallelCore": {"_set_ranks"},
    "FabricCore": {"_bind_mark_step", "compile_backend"},
    "DDPCore": {
        "ddp_kwargs",
        "_on_ddp_wrapped",
        "_fast_ddp_setup",
        "_fast_ddp_accumulating",
        "_after_backward",
        "_fast_ddp_buckets",
    },
    "SingleDeviceCore": {"_check_runnable"},
    "FSDPCore": {"_check_runnable", "_fsdp_arguments", "_set_up_sharded", "_build_device_mesh"},
    "ModelParallelCore": {"_check_runnable", "_reduce_with_sums"},
}


def _core_mixins() -> dict[str, type]:
    from lightning_gaudi.fabric._base import FabricCore
    from lightning_gaudi.strategies import core
    from lightning_gaudi.strategies.ddp_settings import DDPCore
    from lightning_gaudi.strategies.fsdp import FSDPCore
    from lightning_gaudi.strategies.model_parallel import ModelParallelCore

    names = ("HPUStrategyCore", "HPUParallelCore", "TrainerCore", "TrainerParallelCore", "SingleDeviceCore")
    mixins = {
        "FabricCore": FabricCore,
        "DDPCore": DDPCore,
        "FSDPCore": FSDPCore,
        "ModelParallelCore": ModelParallelCore,
    }
    return {**{name: getattr(core, name) for name in names}, **mixins}


def _hpu_strategy_classes() -> list[type]:
    import lightning_gaudi.fabric
    import lightning_gaudi.strategies

    modules = (lightning_gaudi.strategies, lightning_gaudi.fabric)
    found = {c for m in modules for c in vars(m).values() if isinstance(c, type) and issubclass(c, object)}
    return [c for c in found if any(b.__module__.startswith("lightning.") for b in c.__mro__[1:])]


def test_every_method_of_the_core_is_classified() -> None:
    """A method added to the core is declared an override (checked below) or the core's own."""
    for name, mixin in _core_mixins().items():
        defined = {n for n, v in vars(mixin).items() if not n.startswith("__") or n == "__init__"}
        defined = {
            n
            for n in defined
            if callable(vars(mixin)[n]) or isinstance(vars(mixin)[n], property | classmethod | staticmethod)
        }
        partial = {n for (m, n) in PARTIAL_OVERRIDES if m == name}
        assert defined == CORE_OVERRIDES[name] | CORE_OWN[name] | partial, name


def test_the_lightning_bases_still_have_every_method_the_core_overrides() -> None:
    """The core is a mixin for unrelated Lightning bases, so its overrides carry no ``@override`` for mypy to check:
    if Lightning renamed or dropped one of these methods, the core would silently stop being called."""
    checked = set()
    for cls in _hpu_strategy_classes():
        base = next(b for b in cls.__mro__[1:] if b.__module__.startswith("lightning."))
        for name, mixin in _core_mixins().items():
            if mixin not in cls.__mro__:
                continue
            for method in CORE_OVERRIDES[name]:
                assert hasattr(base, method), f"{base.__module__}.{base.__name__} has no {method} ({name} overrides it)"
            for (owner, method), bases in PARTIAL_OVERRIDES.items():
                if owner == name and base.__name__ in bases:
                    assert hasattr(base, method), f"{base.__name__} has no {method} ({name} overrides it)"
            own = [m for m in CORE_OWN[name] if hasattr(base, m)]
            assert not own, f"{base.__name__} now has {own}: the core's own methods override it unawares"
            checked.add((name, base.__module__.split(".")[1]))
    assert {api for _, api in checked} == {"pytorch", "fabric"}, "Trainer and Fabric bases"
    assert {name for name, _ in checked} == set(CORE_OVERRIDES)


@pytest.mark.parametrize("weights_only", [None, True])
def test_a_resume_calls_lightnings_load_checkpoint_as_lightning_2_5_takes_it(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, weights_only: bool | None
) -> None:
    """Lightning 2.5's ``Strategy.load_checkpoint`` takes the path alone (2.6 added ``weights_only``): a resume that
    passed ``weights_only`` on every call failed on the oldest Lightning the package supports."""
    from lightning.pytorch.strategies import Strategy

    calls: list[tuple[Any, ...]] = []
    if weights_only is None:  # Lightning 2.5's signature
        monkeypatch.setattr(Strategy, "load_checkpoint", lambda self, path: calls.append((path,)) or {})
    else:
        monkeypatch.setattr(Strategy, "load_checkpoint", lambda self, path, wo=None: calls.append((path, wo)) or {})
    lightning_gaudi.SingleHPUStrategy().load_checkpoint_files("a.ckpt", weights_only)
    assert calls == ([("a.ckpt",)] if weights_only is None else [("a.ckpt", True)])
