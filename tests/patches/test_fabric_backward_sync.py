"""Canary of ``patches/fabric_backward_sync.py``: ``fabric.no_backward_sync`` on ``hpu_fast_ddp`` runs the strategy's
own control (gradients accumulate locally), set through the patch module."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.fabric import Fabric

from lightning_gaudi import hpu
from lightning_gaudi.fabric import HPUParallelStrategy
from lightning_gaudi.patches import fabric_backward_sync


def test_fabric_asks_the_strategys_control(isolated_env: pytest.MonkeyPatch, monkeypatch: pytest.MonkeyPatch) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")  # the launch exports WORLD_SIZE and the rest: restored after
    assert fabric_backward_sync.missing_targets() == []
    entered: list[Any] = []
    plain = HPUParallelStrategy._fast_ddp_accumulating

    def accumulating(self: HPUParallelStrategy) -> Any:
        entered.append(self)
        return plain(self)

    monkeypatch.setattr(HPUParallelStrategy, "_fast_ddp_accumulating", accumulating)
    fabric = Fabric(accelerator="hpu", devices=1, strategy=HPUParallelStrategy(fast_ddp=True))
    fabric.launch()
    try:
        model = fabric.setup_module(torch.nn.Linear(2, 1))
        with fabric.no_backward_sync(model, enabled=True):
            fabric.backward(model(torch.ones(1, 2)).sum())
        with fabric.no_backward_sync(model, enabled=False):
            fabric.backward(model(torch.ones(1, 2)).sum())
        assert entered == [fabric.strategy], "the control ran, once, for the accumulating backward"
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def test_a_fabric_that_stopped_asking_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_backward_sync(self: Fabric, module: Any, enabled: bool = True) -> Any:
        return None

    monkeypatch.setattr(Fabric, "no_backward_sync", no_backward_sync)
    assert fabric_backward_sync.missing_targets() == [
        "lightning.fabric.fabric.Fabric.no_backward_sync reading the strategy's _backward_sync_control"
    ]
    strategy, control = HPUParallelStrategy(fast_ddp=True), object()
    with pytest.warns(UserWarning, match="all-reduces every backward; DDP works"):
        assert not fabric_backward_sync.set_control(strategy, control)
    assert strategy._backward_sync_control is not control
