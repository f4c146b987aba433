"""Emulator-only code relying on private internals: synchronized batch norm on CPU tensors (:mod:`.sync_batchnorm`)
and evaluation under ``torch.no_grad`` for Lazy Tensor Core (:mod:`.no_grad_eval`)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from lightning_gaudi.emulation import no_grad_eval, sync_batchnorm
from lightning_gaudi.patches.registry import Patch

__all__ = ["PATCHES", "install_all"]

#: The emulator's patches, by name.
PATCHES: Mapping[str, Patch] = MappingProxyType({p.name: p for p in (no_grad_eval.PATCH, sync_batchnorm.PATCH)})


def install_all() -> dict[str, bool]:
    """Checks every emulator patch (idempotent); returns whether each is enabled."""
    return {name: patch.install() for name, patch in PATCHES.items()}
