"""HPUGraphs, HPUCompile and BridgeSettings."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from torch import Tensor, nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import BridgeSettings, HPUCompile, HPUGraphs, RecipeCache
from lightning_gaudi.callbacks.bridge_settings import INT64_ENV, LAZY_MODE_ENV, RECIPE_CACHE_ENV


def _spy_wrap(backend: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    counts = {"wraps": 0, "replays": 0}

    def wrap(module: nn.Module) -> nn.Module:
        counts["wraps"] += 1
        plain = module.forward

        def replay(*args: Any) -> Any:
            counts["replays"] += 1
            return plain(*args)

        module.forward = replay  # type: ignore[method-assign]
        return module

    monkeypatch.setattr(backend, "wrap_in_hpu_graph", wrap)
    return counts


def test_lazy_graphs_for_evaluation_only(lazy_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _spy_wrap(lazy_hpu, monkeypatch)
    trainer = quiet_trainer(max_epochs=2, limit_val_batches=3, callbacks=[HPUGraphs()], inference_mode=False)
    model = Workload()
    trainer.fit(model, loader(4), loader(3))
    assert counts == {"wraps": 1, "replays": 2 * 3}, "captured once, replayed for validation batches only"
    assert "forward" not in vars(model)
    trainer.predict(model, loader(2))
    assert counts == {"wraps": 1, "replays": 2 * 3 + 2}


def test_eager_graphs_warn_and_do_nothing(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _spy_wrap(eager_hpu, monkeypatch)
    with pytest.warns(UserWarning, match="outside lazy mode"):
        quiet_trainer(limit_val_batches=1, callbacks=[HPUGraphs()]).fit(Workload(), loader(2), loader(1))
    assert counts["wraps"] == 0


def test_bridge_graphs_call_wrap_in_hpu_graph(bridge_double: ModuleType) -> None:
    graphs = HPUGraphs(stages=["predict"])
    module = Workload()
    graphs.setup(None, module, "predict")  # type: ignore[arg-type]
    graphs.on_validation_start(None, module)  # type: ignore[arg-type]
    assert bridge_double.called("hpu.wrap_in_hpu_graph") == []
    graphs.on_predict_start(None, module)  # type: ignore[arg-type]
    (call,) = bridge_double.called("hpu.wrap_in_hpu_graph")
    assert call.args == (module,)


def test_bad_stage() -> None:
    with pytest.raises(ValueError, match="stages"):
        HPUGraphs(stages=["fit"])


class CompileProbe(Workload):
    compiled = False

    def forward(self, x: Tensor) -> Tensor:
        CompileProbe.compiled |= torch.compiler.is_compiling()
        return self.net(x)


def test_eager_compile(eager_hpu: hpu.Backend) -> None:
    model = CompileProbe()
    quiet_trainer(max_steps=2, callbacks=[HPUCompile()]).fit(model, loader(2))
    assert CompileProbe.compiled
    assert "forward" not in vars(model), "the plain forward is back after fit"


def test_compile_refuses_lazy_mode_and_a_backend(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match="needs eager mode"):
        quiet_trainer(callbacks=[HPUCompile()]).fit(Workload(), loader(1))
    with pytest.raises(ValueError, match="picks the backend"):
        HPUCompile(backend="inductor")


@pytest.fixture
def bridge_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in (LAZY_MODE_ENV, INT64_ENV, RECIPE_CACHE_ENV):
        monkeypatch.setenv(name, "")  # records the original state, restored after the test
        monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize(
    "recipe_cache",
    ["/tmp/recipes, true ,2048", {"path": "/tmp/recipes", "delete_on_start": True, "max_size_mb": 2048}],
)
def test_settings_applied(bridge_double: ModuleType, bridge_env: pytest.MonkeyPatch, recipe_cache: Any) -> None:
    BridgeSettings(lazy_mode=False, int64_support=True, recipe_cache=recipe_cache)
    assert os.environ[LAZY_MODE_ENV] == "0"
    assert os.environ[INT64_ENV] == "1"
    assert os.environ[RECIPE_CACHE_ENV] == "/tmp/recipes,true,2048"
    assert not hpu.get_backend().is_lazy(), "the bridge reads PT_HPU_LAZY_MODE when it loads"


def test_settings_after_bridge_loaded(bridge_double: ModuleType, bridge_env: pytest.MonkeyPatch) -> None:
    bridge_env.setenv(LAZY_MODE_ENV, "1")
    hpu.get_backend().is_available()
    BridgeSettings(lazy_mode=True)  # already in effect
    with pytest.raises(RuntimeError, match=r"already loaded.*PT_HPU_LAZY_MODE=0"):
        BridgeSettings(lazy_mode=False)
    assert os.environ[LAZY_MODE_ENV] == "1"


def test_emulation_mode_mismatch_warns(eager_hpu: hpu.Backend, bridge_env: pytest.MonkeyPatch) -> None:
    with pytest.warns(UserWarning, match="no effect under LIGHTNING_GAUDI_EMULATE=eager"):
        BridgeSettings(lazy_mode=True)


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RecipeCache.parse("/tmp/r,maybe,10"), "delete_on_start 'maybe'"),
        (lambda: RecipeCache.parse("/tmp/r,true"), "3 comma-separated parts"),
        (lambda: RecipeCache.parse("/tmp/r,true,-5"), "max_MB '-5'"),
        (lambda: RecipeCache.parse(",true,5"), "non-empty directory"),
        (lambda: RecipeCache.parse({"path": "/tmp/r", "size": 5}), r"unknown: \['size'\]"),
        (lambda: RecipeCache("/tmp/r", max_size_mb=0), "max_size_mb=0"),
        (lambda: BridgeSettings(lazy_mode="sometimes"), "lazy_mode='sometimes'"),  # type: ignore[arg-type]
    ],
)
def test_malformed_settings(bridge_env: pytest.MonkeyPatch, make: Callable[[], Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        make()
    assert RECIPE_CACHE_ENV not in os.environ
