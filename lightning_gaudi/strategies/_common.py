"""Checks shared by the HPU strategies."""

from __future__ import annotations

from lightning.pytorch.accelerators import Accelerator


def check_hpu_accelerator(strategy_name: str, accelerator: Accelerator | None) -> None:
    """Raises a clear error when an HPU strategy is given any accelerator but :class:`HPUAccelerator`."""
    from lightning_gaudi.accelerator import HPUAccelerator

    if accelerator is not None and not isinstance(accelerator, HPUAccelerator):
        raise ValueError(
            f"The {strategy_name!r} strategy runs on HPUs, but the accelerator is {type(accelerator).__name__}."
            " Pass `Trainer(accelerator='hpu', ...)` (on a machine without Gaudi, set LIGHTNING_GAUDI_EMULATE=eager)."
        )
