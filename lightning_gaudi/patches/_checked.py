"""The state of a patch that only checks upstream before a feature may use it (``install`` / ``installed``)."""

from __future__ import annotations

from collections.abc import Callable

from lightning_gaudi.patches import registry


class Checked:
    """Whether a check-only patch is in effect: :meth:`install` checks ``missing_targets()`` and the version range
    once (idempotent), warning ``fallback`` (what still works) when the check fails; :meth:`installed` reads it."""

    def __init__(self, missing_targets: Callable[[], list[str]], fallback: str, torch: bool = False) -> None:
        self.enabled = False
        self._missing_targets = missing_targets
        self._fallback = fallback
        self._torch = torch

    def installed(self) -> bool:
        return self.enabled

    def install(self) -> bool:
        self.enabled = self.enabled or registry.supported(self._missing_targets(), self._fallback, torch=self._torch)
        return self.enabled

    def patch(self, name: str, targets: tuple[str, ...]) -> registry.Patch:
        """The :class:`~lightning_gaudi.patches.registry.Patch` describing it."""
        requirement = registry.SUPPORTED_TORCH if self._torch else registry.SUPPORTED_LIGHTNING
        return registry.Patch(name, targets, requirement, self.install, self.installed)
