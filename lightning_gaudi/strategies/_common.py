"""What the HPU strategies share: the accelerator check, device resolution and the trainer preparation at set-up."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from lightning.pytorch.accelerators import Accelerator

from lightning_gaudi import hpu
from lightning_gaudi.accelerator import HPUAccelerator
from lightning_gaudi.callbacks.inference import add_default_compile
from lightning_gaudi.callbacks.mark_step import add_default_mark_step
from lightning_gaudi.callbacks.preemption import add_default_preemption
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


def hpu_device(device: torch.device | str | int | None, owner: str) -> torch.device:
    """The ``torch.device`` this process's HPU backend uses for ``device``.

    ``None`` or an index is the backend's device; an ``"hpu"`` device (``"hpu"``, ``"hpu:1"``, ``torch.device("hpu")``)
    is the HPU on a Gaudi and the emulated device in emulation (``cpu`` for eager, ``lazy`` for lazy); a device of the
    backend's own type is kept.

    Args:
        device: what the user gave.
        owner: who was given it, for the error message.

    Raises:
        ValueError: ``device`` is not a device, or a device of another kind (``cuda``, ``meta``...).
    """
    backend = hpu.get_backend()
    if device is None or (isinstance(device, int) and not isinstance(device, bool)):
        return backend.device(device)
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(
            f"{owner} got device {device!r}, which is not a device: pass 'hpu' or torch.device('hpu')."
        ) from err
    if parsed.type == backend.device_type:
        return parsed
    if parsed.type == "hpu":
        return backend.device(parsed.index)
    raise ValueError(
        f"{owner} got device {parsed}; pass an HPU device ('hpu', torch.device('hpu')), or none and let the Trainer"
        " pick (accelerator='hpu', devices=N)."
    )


def prepare_trainer(trainer: pl.Trainer) -> None:
    """Readies ``trainer`` for the HPU backend; the strategies call it from ``setup_environment``.

    In lazy mode a default :class:`~lightning_gaudi.callbacks.MarkStep` is added, in compile mode a default
    :class:`~lightning_gaudi.callbacks.HPUCompile` (a configured one wins). A default
    :class:`~lightning_gaudi.callbacks.PreemptionCheckpoint` is added unless one is configured. Under lazy
    emulation, evaluation runs under ``torch.no_grad`` instead of ``torch.inference_mode``, which torch's Lazy Tensor
    Core cannot trace.
    """
    add_default_mark_step(trainer)
    add_default_compile(trainer)
    add_default_preemption(trainer)
    backend = hpu.get_backend()
    if backend.emulated and backend.is_lazy():
        disable_inference_mode(trainer)
