"""Execution modes: HPU graphs for evaluation in lazy mode, ``torch.compile`` in eager mode."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from lightning_gaudi import hpu

EVAL_STAGES = ("validate", "test", "predict")


class HPUGraphs(Callback):
    """Captures the module's forward as an HPU graph for validation, test and predict (lazy mode).

    The first evaluation batch records the graph (``wrap_in_hpu_graph``); later batches of the same shapes replay it,
    which removes the host's per-batch graph building. Training never runs through the captured graph: the plain
    forward is put back when evaluation ends, and the captured one reused at the next evaluation. Outside lazy mode
    it warns once and does nothing (use :class:`HPUCompile` there). Under emulation the wrap is the identity.

    Args:
        stages: which of ``"validate"``, ``"test"``, ``"predict"`` use the graph.

    Raises:
        ValueError: an unknown stage.
    """

    def __init__(self, stages: Iterable[str] = EVAL_STAGES) -> None:
        self.stages = tuple(stages)
        unknown = [stage for stage in self.stages if stage not in EVAL_STAGES]
        if unknown:
            raise ValueError(f"HPUGraphs got stages {unknown}; choose from {list(EVAL_STAGES)}.")
        self._active = self._captured = self._entered = False
        self._wrapped: Any = None
        self._plain: Any = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._active = hpu.get_backend().is_lazy()
        if not self._active:
            rank_zero_warn("HPUGraphs does nothing outside lazy mode (PT_HPU_LAZY_MODE=1); use HPUCompile there.")

    def _enter(self, pl_module: pl.LightningModule, stage: str) -> None:
        if not self._active or stage not in self.stages:
            return
        self._entered = True
        self._plain = vars(pl_module).get("forward")
        if not self._captured:
            hpu.get_backend().wrap_in_hpu_graph(pl_module)
            self._captured = True
            self._wrapped = vars(pl_module).get("forward")
        elif self._wrapped is not None:
            pl_module.forward = self._wrapped  # type: ignore[method-assign]

    def _leave(self, pl_module: pl.LightningModule) -> None:
        if not self._entered:
            return
        self._entered = False
        if self._plain is not None:
            pl_module.forward = self._plain  # type: ignore[method-assign]
        else:
            vars(pl_module).pop("forward", None)
        self._plain = None

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._enter(pl_module, "validate")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave(pl_module)

    @override
    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._enter(pl_module, "test")

    @override
    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave(pl_module)

    @override
    def on_predict_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._enter(pl_module, "predict")

    @override
    def on_predict_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._leave(pl_module)


class HPUCompile(Callback):
    """Runs the module's forward through ``torch.compile`` with the HPU backend (eager mode only).

    On Gaudi the backend is ``hpu_backend`` and needs eager mode (``lightning_gaudi.configure(execution_mode="eager")``
    before the Trainer, which sets ``PT_HPU_LAZY_MODE=0``); under
    eager emulation it is a CPU backend (``aot_eager``). The plain forward is restored at teardown.

    Args:
        **compile_kwargs: passed to ``torch.compile`` (``dynamic``, ``fullgraph``, ``mode``, ``options``).

    Raises:
        ValueError: at setup, in lazy mode; or a ``backend`` in ``compile_kwargs`` (the HPU decides it).
    """

    def __init__(self, **compile_kwargs: Any) -> None:
        if "backend" in compile_kwargs:
            raise ValueError(
                f"HPUCompile picks the backend itself (the HPU's, e.g. 'hpu_backend'); got"
                f" backend={compile_kwargs['backend']!r}. Leave it out."
            )
        self.compile_kwargs = compile_kwargs
        self._module: pl.LightningModule | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        backend = hpu.get_backend()
        if backend.is_lazy():
            raise ValueError(
                "HPUCompile needs eager mode, but the HPU runs in lazy mode. Call"
                " lightning_gaudi.configure(execution_mode='eager') before building the Trainer (Hydra:"
                " runtime.execution_mode=eager; CLI: --runtime.execution_mode eager), or export PT_HPU_LAZY_MODE=0"
                " (LIGHTNING_GAUDI_EMULATE=eager in emulation) before starting Python."
                " Or remove HPUCompile (lazy mode builds graphs itself; HPUGraphs helps evaluation)."
            )
        if self._module is None:
            compiled = torch.compile(pl_module.forward, backend=backend.compile_backend, **self.compile_kwargs)
            pl_module.forward = compiled  # type: ignore[method-assign]
            self._module = pl_module

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._module is not None:
            vars(self._module).pop("forward", None)
            self._module = None
