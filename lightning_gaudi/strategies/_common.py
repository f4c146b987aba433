"""What the HPU strategies share: the accelerator check and the trainer preparation at set-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

from lightning.pytorch.accelerators import Accelerator

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.callbacks.mark_step import add_default_mark_step
from lightning_gaudi.patches.loops import disable_inference_mode

if TYPE_CHECKING:
    import lightning.pytorch as pl


def check_hpu_accelerator(strategy_name: str, accelerator: Accelerator | None) -> None:
    """Raises a clear error when an HPU strategy is given any accelerator but :class:`HPUAccelerator`."""
    if accelerator is not None and not isinstance(accelerator, HPUAccelerator):
        raise ValueError(
            f"The {strategy_name!r} strategy runs on HPUs, but the accelerator is {type(accelerator).__name__}."
            " Pass `Trainer(accelerator='hpu', ...)` (on a machine without Gaudi, set LIGHTNING_GAUDI_EMULATE=eager)."
        )


def prepare_trainer(trainer: pl.Trainer) -> None:
    """Readies ``trainer`` for the HPU backend; the strategies call it from ``setup_environment``.

    In lazy mode a default :class:`~lightning_gaudi.callbacks.MarkStep` is added (a configured one wins). Under
    lazy emulation, evaluation runs under ``torch.no_grad`` instead of ``torch.inference_mode``, which torch's
    Lazy Tensor Core cannot trace.
    """
    add_default_mark_step(trainer)
    backend = hpu.get_backend()
    if backend.emulated and backend.is_lazy():
        disable_inference_mode(trainer)
