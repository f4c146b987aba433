"""What a patch is, and the upstream versions the patches were checked against.

Every patch module of :mod:`lightning_gaudi.patches` describes itself with a :class:`Patch` and checks the installed
version with :data:`LIGHTNING_SUPPORTED` or :data:`TORCH_SUPPORTED` (read at call time, so a test can replace them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from lightning_utilities.core.imports import RequirementCache

#: The Lightning versions every Lightning patch was checked against.
SUPPORTED_LIGHTNING = "lightning>=2.5,<2.7"
#: The torch versions the LR-scheduler patch was checked against (torch's private optimizer-step flags).
SUPPORTED_TORCH = "torch>=2.4,<2.14"

#: Truthy when the installed Lightning is in :data:`SUPPORTED_LIGHTNING`; ``.message`` says why not otherwise.
LIGHTNING_SUPPORTED = RequirementCache(SUPPORTED_LIGHTNING)
#: Truthy when the installed torch is in :data:`SUPPORTED_TORCH`.
TORCH_SUPPORTED = RequirementCache(SUPPORTED_TORCH)


@dataclass(frozen=True)
class Patch:
    """One patch of Lightning's or torch's private internals.

    Attributes:
        name: the registry key, e.g. ``"connector"``.
        targets: the upstream objects the patch replaces or relies on, as dotted paths.
        requirement: the versions it was checked against (:data:`SUPPORTED_LIGHTNING` or :data:`SUPPORTED_TORCH`).
        install: puts the patch in effect (idempotent) and returns whether it is; on an unsupported version it
            patches nothing and warns what still works.
        installed: whether the patch is in effect.
    """

    name: str
    targets: tuple[str, ...]
    requirement: str
    install: Callable[[], bool]
    installed: Callable[[], bool]
