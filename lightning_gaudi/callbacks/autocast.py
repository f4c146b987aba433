"""bf16 autocast op lists: checked against what the bridge loaded on a Gaudi, applied to CPU autocast in emulation."""

from __future__ import annotations

from collections.abc import Iterable

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.hpu.autocast_lists import check_op_names
from lightning_gaudi.precision import HPUPrecision, OpListMode

__all__ = ["BF16Autocast", "OpListMode"]


class BF16Autocast(Callback):
    """Chooses which ops run in bfloat16 and which stay in float32 under ``precision="bf16-mixed"``: on a Gaudi it
    checks the bridge loaded the lists (``lightning_gaudi.configure(autocast_bf16_ops=..., autocast_fp32_ops=...)``
    before the Trainer), in eager emulation it sets :class:`~lightning_gaudi.HPUPrecision`'s ``op_lists``.

    Args:
        bf16_ops: op names to run in bfloat16, e.g. ``["linear", "matmul", "gelu"]``; ``None``: the runtime's list.
        fp32_ops: op names to keep in float32, e.g. ``["softmax", "log_softmax", "nll_loss"]``.

    Raises:
        ValueError: an unknown op name or one in both lists; at set-up, a precision other than ``bf16-mixed``.
        RuntimeError: at set-up on a Gaudi, lists that the bridge did not load.
    """

    def __init__(self, bf16_ops: Iterable[str] | None = None, fp32_ops: Iterable[str] | None = None) -> None:
        self.bf16_ops = check_op_names("bf16_ops", bf16_ops)
        self.fp32_ops = check_op_names("fp32_ops", fp32_ops)
        both = sorted(set(self.bf16_ops or ()) & set(self.fp32_ops or ()))
        if both:
            raise ValueError(f"{both} are in both `bf16_ops` and `fp32_ops`; name each op in one list only.")
        self._plugin: HPUPrecision | None = None

    def _check_bridge_lists(self, runtime: hpu.Runtime) -> None:
        given = {
            "bf16_ops": (self.bf16_ops, runtime.autocast_bf16_ops),
            "fp32_ops": (self.fp32_ops, runtime.autocast_fp32_ops),
        }
        missing = [name for name, (mine, loaded) in given.items() if mine is not None and mine != loaded]
        if missing:
            settings = ", ".join(f"autocast_{name}={list(given[name][0] or ())}" for name in missing)
            raise RuntimeError(
                f"BF16Autocast got {', '.join(missing)} that Intel's bridge did not load: the bridge reads its autocast"
                f" lists once, when it starts. Call lightning_gaudi.configure({settings}) before building the"
                " Trainer (Hydra: runtime.autocast_*; CLI: --runtime.autocast_*), and construct BF16Autocast()"
                " without lists."
            )

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        plugin = trainer.precision_plugin
        if not isinstance(plugin, MixedPrecision) or plugin.precision != "bf16-mixed":
            raise ValueError(
                f"BF16Autocast needs `Trainer(precision='bf16-mixed')`; this Trainer runs"
                f" precision={getattr(plugin, 'precision', type(plugin).__name__)!r}."
            )
        runtime = hpu.Runtime.from_env()
        if hpu.get_backend().applies_autocast_lists:
            self._check_bridge_lists(runtime)
            return  # the bridge applies its lists itself
        bf16_ops = self.bf16_ops if self.bf16_ops is not None else runtime.autocast_bf16_ops
        fp32_ops = self.fp32_ops if self.fp32_ops is not None else runtime.autocast_fp32_ops
        if bf16_ops is None and fp32_ops is None:
            return
        if not isinstance(plugin, HPUPrecision):
            raise ValueError(
                f"BF16Autocast applies its op lists through lightning_gaudi.HPUPrecision, not"
                f" {type(plugin).__qualname__}. Pass `Trainer(precision='bf16-mixed')` or"
                " `plugins=[lightning_gaudi.HPUPrecision('bf16-mixed')]`."
            )
        plugin.op_lists = OpListMode(plugin.device, bf16_ops or (), fp32_ops or ())  # built once, entered per step
        self._plugin = plugin

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._plugin is not None:
            self._plugin.op_lists = None
            self._plugin = None
