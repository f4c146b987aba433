"""Compile mode (eager + torch.compile) as one runtime setting, and what it gives ``Trainer(accelerator="hpu")``."""

from __future__ import annotations

import os
from types import ModuleType

import pytest
import torch
from helpers.hf_style import HFStyleClassifier, TinyForSequenceClassification, token_loader, token_samples
from helpers.workload import quiet_trainer

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import HPUCompile, dynamo
from lightning_gaudi.emulator import eager
from lightning_gaudi.hpu.runtime import (
    COMPILE_BACKEND_ENV,
    COMPILE_ENV,
    LAZY_MODE_ENV,
    Runtime,
    configure,
    emulated_compile_backend,
)


@pytest.fixture
def runtime_env(isolated_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (LAZY_MODE_ENV, COMPILE_ENV):
        isolated_env.delenv(name, raising=False)
    return isolated_env


def test_compile_mode_in_emulation_runs_on_the_eager_emulator(runtime_env: pytest.MonkeyPatch) -> None:
    settings = configure(emulate=True, execution_mode="compile")
    assert settings.execution_mode == "compile"
    assert os.environ[hpu.EMULATE_ENV] == "eager"
    assert os.environ[COMPILE_ENV] == "1"
    assert Runtime.from_env().execution_mode == "compile", "rank processes read it back"
    backend = hpu.get_backend()
    assert not backend.is_lazy()
    assert backend.compile_backend == "aot_eager", "tests/conftest.py picks aot_eager"
    runtime_env.delenv(COMPILE_BACKEND_ENV)
    assert backend.compile_backend == emulated_compile_backend() == "inductor"
    assert configure(execution_mode="eager").execution_mode == "eager"
    assert COMPILE_ENV not in os.environ
    assert configure(execution_mode="lazy").execution_mode == "lazy"


@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_compile_mode_on_a_gaudi_sets_eager_in_the_bridge(
    bridge_double: ModuleType, runtime_env: pytest.MonkeyPatch
) -> None:
    assert configure(execution_mode="compile") == Runtime(emulate=False, execution_mode="compile")
    assert os.environ[LAZY_MODE_ENV] == "0"
    backend = hpu.get_backend()
    assert not backend.is_lazy(), "the bridge reads PT_HPU_LAZY_MODE=0 when it loads"
    assert backend.compile_backend == "hpu_backend"
    assert backend.check_compile_backend() == "hpu_backend"


def test_unset_mode_follows_the_bridge(bridge_double: ModuleType, runtime_env: pytest.MonkeyPatch) -> None:
    assert configure().execution_mode is None
    runtime_env.setenv(LAZY_MODE_ENV, "0")
    assert configure().execution_mode == "eager"
    runtime_env.setenv(COMPILE_ENV, "1")
    assert configure().execution_mode == "compile", "a compile setting already exported is kept"


def test_compile_flag_with_lazy_mode_is_an_error_that_changes_nothing(runtime_env: pytest.MonkeyPatch) -> None:
    runtime_env.setenv(hpu.EMULATE_ENV, "lazy")
    runtime_env.setenv(COMPILE_ENV, "1")
    with pytest.raises(ValueError, match=r"LIGHTNING_GAUDI_COMPILE=1 asks for compile mode.*EMULATE=lazy"):
        Runtime.from_env()
    before = dict(os.environ)
    with pytest.raises(ValueError, match="asks for lazy mode"):
        configure(int64_support=True)
    assert dict(os.environ) == before
    assert configure(execution_mode="compile").execution_mode == "compile", "an explicit mode resolves it"
    runtime_env.setenv(COMPILE_ENV, "maybe")
    with pytest.raises(ValueError, match=r"LIGHTNING_GAUDI_COMPILE='maybe' must be 1"):
        Runtime.from_env()


def test_bad_execution_mode_names_the_choices(runtime_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"'compile' \(eager \+ torch.compile\), 'eager' or 'lazy'"):
        Runtime(execution_mode="graph")  # type: ignore[arg-type]


def test_trainer_in_compile_mode_compiles_without_a_callback(runtime_env: pytest.MonkeyPatch) -> None:
    torch.compiler.reset()
    configure(emulate=True, execution_mode="compile")
    trainer = quiet_trainer(max_steps=2)
    model = HFStyleClassifier()
    trainer.fit(model, token_loader(token_samples(8, 8, 8)))
    (added,) = [c for c in trainer.callbacks if isinstance(c, HPUCompile)]  # type: ignore[attr-defined]
    assert trainer.callbacks[0] is added  # type: ignore[attr-defined]
    assert dynamo.cache_entries(TinyForSequenceClassification.forward) >= 1
    mine = HPUCompile(regional=True)
    trainer = quiet_trainer(max_steps=1, callbacks=[mine])
    trainer.fit(HFStyleClassifier(), token_loader(token_samples(4, 8, 8)))
    assert [c for c in trainer.callbacks if isinstance(c, HPUCompile)] == [mine], "a configured one wins"  # type: ignore[attr-defined]
    configure(execution_mode="eager")
    trainer = quiet_trainer(max_steps=1)
    trainer.fit(HFStyleClassifier(), token_loader(token_samples(4, 8, 8)))
    assert not [c for c in trainer.callbacks if isinstance(c, HPUCompile)]  # type: ignore[attr-defined]


def test_emulation_backend_is_checked(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "inductr")
    with pytest.raises(ValueError, match=r"LIGHTNING_GAUDI_COMPILE_BACKEND='inductr' is not a torch.compile backend"):
        eager_hpu.check_compile_backend()
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "inductor")
    assert eager_hpu.check_compile_backend() == "inductor", "this machine has a C++ compiler"
    monkeypatch.setattr(eager, "cpp_compiler", lambda: None)
    with pytest.raises(RuntimeError, match=r"needs a C\+\+ compiler.*apt-get install g\+\+.*BACKEND=aot_eager"):
        eager_hpu.check_compile_backend()
