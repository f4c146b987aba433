"""``precision="fp8"`` through Lightning's precision-name check (``_convert_precision_to_unified_args``, in both
:data:`MODULES`) to the connectors' routing policy; installed after (and only with) the connector patches."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from lightning_gaudi.patches import connector, fabric_connector, registry

MODULES = ("lightning.fabric.connector", "lightning.pytorch.trainer.connectors.accelerator_connector")
_NAME = "_convert_precision_to_unified_args"
FP8 = "fp8"
_MARK = "__lightning_gaudi_fp8_hook__"


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    missing = [f"{name}.{_NAME}" for name in MODULES if not callable(registry.lookup(name, _NAME))]
    if not (connector.installed() and fabric_connector.installed()):
        missing.append("lightning_gaudi's connector patches (they route 'fp8' to the HPU FP8 plugin)")
    return missing


def _wrap(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(original)
    def convert_precision(precision: Any) -> Any:
        return FP8 if isinstance(precision, str) and precision == FP8 else original(precision)

    setattr(convert_precision, _MARK, True)
    return convert_precision


def installed() -> bool:
    """Whether ``precision="fp8"`` passes Lightning's name check and the connectors route it."""
    marked = all(getattr(registry.lookup(name, _NAME), _MARK, False) for name in MODULES)
    return marked and connector.installed() and fabric_connector.installed()


def install() -> bool:
    """Lets ``"fp8"`` through Lightning's precision-name check (idempotent); returns whether it does, else warns."""
    if installed():
        return True
    fallback = (
        "`precision='fp8'` is not accepted by name: pass `plugins=[lightning_gaudi.fp8.HPUFP8Precision()]`"
        " (Fabric: lightning_gaudi.fabric.HPUFP8Precision)."
    )
    if not registry.supported(missing_targets(), fallback):
        return False
    for name in MODULES:
        module = registry.lookup(name)
        current = getattr(module, _NAME)
        if not getattr(current, _MARK, False):
            setattr(module, _NAME, _wrap(current))
    return True


PATCH = registry.Patch(
    name="fp8_precision_name",
    targets=tuple(f"{name}.{_NAME}" for name in MODULES),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
