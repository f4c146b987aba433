"""The ``"hpu"`` accelerator."""

from __future__ import annotations

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
        if text == "auto":
            devices = -1
        elif "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()] if _is_int_list(text) else []
            if not devices:
                raise ValueError(f"`devices={original!r}` is not a list of HPU indices; write it like '0,1'.")
        elif text.lstrip("-").isdigit():
            devices = int(text)
        else:
            raise ValueError(f"`devices={original!r}` is not understood; pass an int, 'auto', -1, a list or '0,1'.")
    if isinstance(devices, bool) or not isinstance(devices, (int, list, tuple)):
        raise ValueError(
            f"`devices={original!r}` must be an int, 'auto', -1, a list of indices or a string like '0,1'."
        )
    if isinstance(devices, int):
        if devices == -1:
            devices = available
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


def _is_int_list(text: str) -> bool:
    return all(part.strip().isdigit() for part in text.split(",") if part.strip())


class HPUAccelerator(Accelerator):
    """Intel Gaudi HPUs, real or emulated on the CPU (see :mod:`lightning_gaudi.hpu`).

    One process drives one card. On Gaudi, ``HABANA_VISIBLE_MODULES`` selects which physical cards a node uses;
    ``devices`` says how many of them to train on.
    """

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
        """The bridge's ``memory_stats``, keyed by its names.

        Sizes are in GiB and say so (``hpu/InUse (GiB)``, ``hpu/MaxInUse (GiB)``, ``hpu/Limit (GiB)``,
        ``hpu/MaxAllocSize (GiB)``); allocation counters are counts (``hpu/NumAllocs``, ``hpu/ActiveAllocs``, ...).
        A key this package does not know is passed on as the bridge reports it, without a unit.
        """
        stats = {}
        for key, value in hpu.get_backend().memory_stats().items():
            if key in MEMORY_BYTE_KEYS:
                stats[f"hpu/{key} (GiB)"] = round(value / _GIB, 4)
            else:
                stats[f"hpu/{key}"] = value
        return stats

    @staticmethod
    def get_device_name() -> str:
        """The name of the Gaudi this process drives, as the bridge reports it (``"GAUDI"``, ``"GAUDI2"``, ...).

        Under emulation, the emulated generation (``LIGHTNING_GAUDI_DEVICE_NAME``, default ``"GAUDI2"``).

        Raises:
            HPUUnavailableError: there is no HPU, real or emulated.
        """
        return hpu.get_backend().device_name()

    @override
    def teardown(self) -> None:
        """Nothing to release: the bridge frees device memory itself and has no ``empty_cache``."""

    @staticmethod
    @override
    def parse_devices(devices: int | str | list[int]) -> list[int]:
        """The HPU indices ``devices`` selects.

        Accepts a count, ``"auto"`` or ``-1`` (all), a list of indices or a string like ``"0,1"``.

        Raises:
            ValueError: zero devices, more than the node has, or an index out of range.
        """
        backend = hpu.get_backend()
        note = (
            f" Lazy emulation drives one HPU (gloo collectives cannot carry Lazy Tensor Core tensors); emulate"
            f" several with {hpu.EMULATE_ENV}=eager."
            if backend.emulated and backend.is_lazy()
            else ""
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
        """The number of HPUs on this node (real or emulated)."""
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
