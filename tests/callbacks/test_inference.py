"""HPUGraphs and HPUCompile."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import FEATURES, Workload, loader, quiet_trainer
from torch import Tensor, nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import HPUCompile, HPUGraphs


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


def test_bridge_graphs_capture_once_replay_in_evaluation_only(bridge_double: ModuleType) -> None:
    """The bridge's wrap replaces ``forward`` in place (as the double does): HPUGraphs captures once, replays during
    predict, puts the plain forward back for training, and reuses the capture at the next predict."""
    graphs = HPUGraphs(stages=["predict"])
    module = Workload()
    batch = torch.ones(2, FEATURES)
    graphs.setup(None, module, "predict")  # type: ignore[arg-type]
    graphs.on_validation_start(None, module)  # type: ignore[arg-type]
    assert bridge_double.called("hpu.wrap_in_hpu_graph") == []
    for _ in range(2):
        graphs.on_predict_start(None, module)  # type: ignore[arg-type]
        module(batch)
        graphs.on_predict_end(None, module)  # type: ignore[arg-type]
        assert "forward" not in vars(module), "training runs the plain forward"
        module(batch)
    (call,) = bridge_double.called("hpu.wrap_in_hpu_graph")
    assert call.args == (module,)
    assert len(bridge_double.called("hpu.graph_replay")) == 2


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
