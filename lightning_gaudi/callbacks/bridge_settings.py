"""Bridge settings from configuration, validated and put in the environment before the bridge loads."""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lightning.pytorch.callbacks import Callback

from lightning_gaudi import hpu

LAZY_MODE_ENV = "PT_HPU_LAZY_MODE"
INT64_ENV = "PT_ENABLE_INT64_SUPPORT"
RECIPE_CACHE_ENV = "PT_HPU_RECIPE_CACHE_CONFIG"
_FLAGS = {"true": True, "1": True, "false": False, "0": False}


@dataclass(frozen=True)
class RecipeCache:
    """The bridge's on-disk cache of compiled graphs (``PT_HPU_RECIPE_CACHE_CONFIG``).

    Attributes:
        path: a directory on local disk (the bridge does not support shared file systems here).
        delete_on_start: empty the directory when the bridge starts.
        max_size_mb: the cache's size limit; the oldest recipes are evicted first.
    """

    path: str
    delete_on_start: bool = False
    max_size_mb: int = 1024

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.strip() or "," in self.path:
            raise ValueError(f"recipe cache path {self.path!r} must be a non-empty directory path without commas.")
        if not isinstance(self.delete_on_start, bool):
            raise ValueError(f"recipe cache delete_on_start={self.delete_on_start!r} must be true or false.")
        size = self.max_size_mb
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"recipe cache max_size_mb={size!r} must be a positive whole number of megabytes.")

    @classmethod
    def parse(cls, value: RecipeCache | str | Mapping[str, Any]) -> RecipeCache:
        """Reads ``"<dir>,<delete_on_start true|false>,<max_MB>"``, a mapping of the attributes, or an instance.

        Raises:
            ValueError: a malformed setting, saying which part and the expected form.
        """
        if isinstance(value, RecipeCache):
            return value
        if isinstance(value, Mapping):
            unknown = set(value) - {"path", "delete_on_start", "max_size_mb"}
            if unknown or "path" not in value:
                raise ValueError(
                    f"recipe cache {dict(value)!r} needs `path` and may have `delete_on_start`, `max_size_mb`"
                    f" (unknown: {sorted(unknown) or 'none'})."
                )
            return cls(**value)
        if not isinstance(value, str):
            raise ValueError(f"recipe cache {value!r} must be a string like '/tmp/recipes,false,1024' or a mapping.")
        parts = [part.strip() for part in value.split(",")]
        if len(parts) != 3:
            raise ValueError(
                f"recipe cache {value!r} must have 3 comma-separated parts: '<dir>,<delete_on_start true|false>,"
                "<max_MB>', e.g. '/tmp/recipes,false,1024'."
            )
        path, delete, size = parts
        if delete.lower() not in _FLAGS:
            raise ValueError(f"recipe cache {value!r}: delete_on_start {delete!r} must be true or false.")
        if not size.isdigit():
            raise ValueError(f"recipe cache {value!r}: max_MB {size!r} must be a positive whole number.")
        return cls(path, _FLAGS[delete.lower()], int(size))

    def env_value(self) -> str:
        """The value of ``PT_HPU_RECIPE_CACHE_CONFIG``."""
        return f"{self.path},{str(self.delete_on_start).lower()},{self.max_size_mb}"


def _flag(name: str, value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, str) and value.strip().lower() in _FLAGS:
        value = _FLAGS[value.strip().lower()]
    if not isinstance(value, bool):
        raise ValueError(f"`{name}={value!r}` must be true or false.")
    return "1" if value else "0"


class BridgeSettings(Callback):
    """Settings the bridge reads once when it loads, validated and applied to the environment at construction.

    Construct it before the Trainer (Hydra and LightningCLI build callbacks first), as the first callback.

    Args:
        lazy_mode: ``PT_HPU_LAZY_MODE``: ``True`` for lazy mode, ``False`` for eager mode (needed by torch.compile).
        int64_support: ``PT_ENABLE_INT64_SUPPORT``: keep int64 tensors instead of casting them to int32.
        recipe_cache: ``PT_HPU_RECIPE_CACHE_CONFIG``: a :class:`RecipeCache`, a mapping of its fields, or the string
            ``"<dir>,<delete_on_start>,<max_MB>"``.

    Raises:
        ValueError: a malformed setting.
        RuntimeError: the bridge is already loaded with different values (they can no longer take effect).
    """

    def __init__(
        self,
        lazy_mode: bool | None = None,
        int64_support: bool | None = None,
        recipe_cache: RecipeCache | str | Mapping[str, Any] | None = None,
    ) -> None:
        env = {LAZY_MODE_ENV: _flag("lazy_mode", lazy_mode), INT64_ENV: _flag("int64_support", int64_support)}
        if recipe_cache is not None:
            env[RECIPE_CACHE_ENV] = RecipeCache.parse(recipe_cache).env_value()
        self.env = {name: value for name, value in env.items() if value is not None}
        self.apply()

    def apply(self) -> None:
        """Puts the settings in the environment (nothing changes when the bridge already has them)."""
        changed = {name: value for name, value in self.env.items() if os.environ.get(name) != value}
        if not changed:
            return
        if hpu.bridge_loaded():
            settings = ", ".join(f"{name}={value}" for name, value in changed.items())
            raise RuntimeError(
                f"Intel's bridge is already loaded, so {settings} cannot take effect. Construct BridgeSettings before"
                " the Trainer and before anything imports habana_frameworks, or export the variables before starting"
                " Python."
            )
        mode = hpu.emulation_mode()
        lazy = changed.get(LAZY_MODE_ENV)
        if mode is not None and lazy is not None and (lazy == "1") != (mode == "lazy"):
            warnings.warn(
                f"{LAZY_MODE_ENV}={lazy} has no effect under {hpu.EMULATE_ENV}={mode}: the emulation decides the"
                " mode there.",
                stacklevel=2,
            )
        os.environ.update(changed)
