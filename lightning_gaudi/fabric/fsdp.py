"""Fabric's ``"hpu_fsdp"`` strategy, and what Fabric's sharded HPU strategies share."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ClassVar

import torch
from lightning.fabric.plugins.precision.fsdp import FSDPPrecision
from lightning.fabric.strategies import FSDPStrategy, Strategy
from lightning.fabric.utilities.types import _PATH
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn import Module
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.fabric._base import FabricParallelCore
from lightning_gaudi.precision import check_precision_supported
from lightning_gaudi.resume import load_or_fall_back
from lightning_gaudi.safe_load import check_weights_only
from lightning_gaudi.strategies._staged import save_staged
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.fsdp import FSDP_CARRIED, FSDP_FOLDED, FSDPCore, has_meta_tensors


class FabricShardedCore(FabricParallelCore):
    """What Fabric's sharded HPU strategies add: sharded checkpoints staged and renamed into place with their checksum
    index, and loads that fall back past a chosen checkpoint that fails to load."""

    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Writes ``state``: sharded (a directory staged, then renamed into place), or one full file."""
        save: Callable[..., None] = super().save_checkpoint  # type: ignore[misc]
        if not (
            getattr(self, "_save_distributed_checkpoint", False) or getattr(self, "_state_dict_type", "") == "sharded"
        ):
            save(path, state, storage_options, filter)
            return
        save_staged(self, path, lambda staging: save(staging, state, storage_options, filter), checksums=True)

    def load_checkpoint(
        self,
        path: _PATH,
        state: Any = None,
        strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Loads ``path`` into ``state`` once what it holds besides tensor data reads under torch's weights-only rules
        (:func:`lightning_gaudi.safe_load.check_weights_only`; ``weights_only=False`` trusts it), falling back past a
        chosen one that fails to load (:func:`lightning_gaudi.resume.load_or_fall_back`)."""
        load: Callable[..., dict[str, Any]] = super().load_checkpoint  # type: ignore[misc]
        extra = {} if weights_only is None else {"weights_only": weights_only}  # Lightning 2.5 takes no weights_only

        def checked(chosen: str) -> dict[str, Any]:
            if weights_only is not False:
                check_weights_only(chosen)
            return load(chosen, state, strict, **extra)

        return load_or_fall_back(self, path, checked, "load")


class HPUFSDPPrecision(FSDPPrecision):
    """Fabric's FSDP precision, autocasting on the HPU device type (Lightning's autocasts on CUDA); ``ValueError``
    for a precision FSDP or the device cannot run."""

    def __init__(self, precision: str) -> None:
        check_precision_supported(precision)
        self._device = hpu.get_backend().autocast_device_type
        super().__init__(precision, ShardedGradScaler(device=self._device) if precision == "16-mixed" else None)  # type: ignore[arg-type]

    @override
    def forward_context(self) -> AbstractContextManager[Any]:
        if "mixed" not in self.precision or self._device is None:
            return super().forward_context()
        return torch.autocast(self._device, dtype=torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16)


class HPUFSDPStrategy(FSDPCore, FabricShardedCore, FSDPStrategy):
    """Fabric's counterpart of :class:`lightning_gaudi.HPUFSDPStrategy`, with Fabric's ``FSDPStrategy`` arguments
    (``state_dict_type="sharded"`` by default)."""

    api = "Fabric"
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (FSDPStrategy,)
    adoption = Adoption(extra="_fsdp_kwargs", folded=FSDP_FOLDED, carried=FSDP_CARRIED)
    kwargs_attribute = "_fsdp_kwargs"

    def hpu_precision_plugin(self, precision: str) -> HPUFSDPPrecision:
        """The precision plugin for ``Fabric(precision=...)``."""
        return HPUFSDPPrecision(precision)

    @override
    def module_to_device(self, module: Module) -> None:
        if not has_meta_tensors(module):  # a model built on the meta device is materialized by FSDP, on the card
            super().module_to_device(module)

    @override
    def setup_module(self, module: Module) -> Module:
        return self._set_up_sharded(module, super().setup_module)

    @override
    def _setup_distributed(self) -> None:
        super()._setup_distributed()
        self._build_device_mesh()
