"""OmegaConf resolvers (:data:`RESOLVERS`) that make every rank of a launch agree on one run folder."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from omegaconf import OmegaConf

from lightning_gaudi.distributed.environment import LaunchEnvironment
from lightning_gaudi.hpu import runtime


def run_id(default: str) -> str:
    """The launch's shared run id, or ``default`` when no launcher started this process."""
    return LaunchEnvironment.from_env().run_id or default


def rank_zero(value: Any) -> Any:
    """``value`` on global rank zero, ``None`` elsewhere."""
    return value if LaunchEnvironment.from_env().is_global_zero else None


def rank_suffix() -> str:
    """``""`` on global rank zero, ``"_rank<N>"`` elsewhere."""
    env = LaunchEnvironment.from_env()
    return "" if env.is_global_zero else f"_rank{env.rank_label}"


def on_gaudi(on_gaudi: Any, emulated: Any) -> Any:
    """``on_gaudi`` when the run uses Intel's bridge, ``emulated`` when it emulates the HPU."""
    return on_gaudi if runtime.emulation_mode() is None and runtime.bridge_installed() else emulated


RESOLVERS: dict[str, Callable[..., Any]] = {
    "lg.run_id": run_id,
    "lg.rank_zero": rank_zero,
    "lg.rank_suffix": rank_suffix,
    "lg.on_gaudi": on_gaudi,
}


def register_resolvers() -> None:
    """Registers the ``lg.*`` resolvers with OmegaConf (idempotent)."""
    for name, resolver in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, resolver, replace=True)
