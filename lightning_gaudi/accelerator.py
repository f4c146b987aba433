"""The ``"hpu"`` accelerator."""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.fabric.accelerators.registry import _AcceleratorRegistry
from lightning.fabric.utilities.types import _DEVICE
from lightning.pytorch.accelerators import Accelerator
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.hpu.backend import MEMORY_BYTE_KEYS

_GIB = 1024**3


def _parse_indices(devices: int | str | list[int] | tuple[int, ...], available: int, limit_note: str = "") -> list[int]:
    original = devices
    if isinstance(devices, str):
        text = devices.strip().lower()
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if text == "auto" or text.lstrip("-").isdigit():
            devices = -1 if text == "auto" else int(text)
        elif "," in text and parts and all(part.isdigit() for part in parts):
            devices = [int(part) for part in parts]
    if isinstance(devices, (bool, str)) or not isinstance(devices, (int, list, tuple)):
        raise ValueError(
            f"`devices={original!r}` must be an int, 'auto', -1, a list of indices or a string like '0,1'."
        )
    if isinstance(devices, int):
        devices = available if devices == -1 else devices
        if devices < 1:
            raise ValueError(
                f"`devices={original!r}` is not a number of HPUs; pass a positive count, 'auto' or -1 (all)."
            )
        if devices > available:
            raise ValueError(
                f"`devices={original!r}` asks for {devices} HPUs but this node has {available}."
                f" Pass `devices={available}` or fewer (or 'auto').{limit_note}"
            )
        return list(range(devices))
    indices = list(devices)
    if not indices:
        raise ValueError(f"`devices={original!r}` selects no HPU; list at least one index.")
    bad = [i for i in indices if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < available]
    if bad:
        raise ValueError(
            f"`devices={original!r}`: HPU index(es) {bad} out of range; this node has {available} HPUs"
            f" (indices 0 to {available - 1}).{limit_note}"
        )
    if len(set(indices)) != len(indices):
        raise ValueError(f"`devices={original!r}` lists an HPU more than once.")
    return indices


class HPUAccelerator(Accelerator):
    """Intel Gaudi HPUs, real or emulated on the CPU (see :mod:`lightning_gaudi.hpu`); one process drives one card."""

    def __init__(self) -> None:
        super().__init__()
        hpu.get_backend()  # fail here, with install and emulation advice, when there is no HPU

    @override
    def setup_device(self, device: torch.device) -> None:
        expected = hpu.get_backend().device_type
        if device.type != expected:
            raise ValueError(f"HPUAccelerator got device {device}; expected a {expected!r} device.")

    @override
    def get_device_stats(self, device: _DEVICE) -> dict[str, Any]:
        """The bridge's ``memory_stats`` as ``hpu/<name>``, sizes in GiB and saying so (``hpu/InUse (GiB)``)."""
        stats = {}
        for key, value in hpu.get_backend().memory_stats().items():
            if key in MEMORY_BYTE_KEYS:
                stats[f"hpu/{key} (GiB)"] = round(value / _GIB, 4)
            else:
                stats[f"hpu/{key}"] = value
        return stats

    @staticmethod
    def get_device_name() -> str:
        """The Gaudi's name as the bridge reports it (``"GAUDI2"``...; the emulated generation under emulation)."""
        return hpu.get_backend().device_name()

    @override
    def teardown(self) -> None:
        """Nothing to release: the bridge frees device memory itself."""

    @staticmethod
    @override
    def parse_devices(devices: int | str | list[int]) -> list[int]:
        """The HPU indices ``devices`` (a count, ``"auto"`` or ``-1`` for all, indices, or ``"0,1"``) selects.

        Raises:
            ValueError: zero devices, more than the node has, or an index out of range.
        """
        backend = hpu.get_backend()
        note = f" {backend.single_device_reason}." if backend.single_device_reason else ""
        visible = os.environ.get(hpu.VISIBLE_MODULES_ENV)
        if visible is not None:
            note += (
                f" This process sees only the cards {hpu.VISIBLE_MODULES_ENV}={visible!r} lists: where the launcher"
                " gives each process its card (Ray Train), pass devices='auto' and set the number of processes in the"
                " launcher (`ScalingConfig(num_workers=N)`)."
            )
        return _parse_indices(devices, backend.device_count(), note)

    @staticmethod
    @override
    def get_parallel_devices(devices: int | str | list[int]) -> list[torch.device]:
        indices = devices if isinstance(devices, list) else HPUAccelerator.parse_devices(devices)
        backend = hpu.get_backend()
        return [backend.device(i) for i in indices]

    @staticmethod
    @override
    def auto_device_count() -> int:
        return hpu.get_backend().device_count()

    @staticmethod
    @override
    def is_available() -> bool:
        return hpu.is_available()

    @staticmethod
    @override
    def name() -> str:
        return "hpu"

    @classmethod
    @override
    def register_accelerators(cls, accelerator_registry: _AcceleratorRegistry) -> None:
        accelerator_registry.register(cls.name(), cls, description=cls.__name__, override=True)
