"""Which optimizers Lightning's fp16 plugin leaves scaled until their step, so they can be unscaled before clipping.

With a gradient scaler (``precision="16-mixed"``), Lightning's ``MixedPrecision.optimizer_step`` unscales gradients
before clipping, except for optimizers that unscale inside their own ``step()``: torch's fused ones, which carry the
private flag ``_step_supports_amp_scaling`` that ``torch.amp.GradScaler.step`` reads to hand them the scale and the
inf check. Lightning asks ``lightning.fabric.plugins.precision.amp._optimizer_handles_unscaling`` which those are, and
its ``MixedPrecision.clip_gradients`` refuses to clip them. :class:`~lightning_gaudi.precision.HPUPrecision` unscales
them itself before clipping and asks :func:`unscales_in_step`, the same question Lightning asks, so that exactly the
optimizers Lightning left scaled are unscaled once. ``tests/patches/test_amp_unscaling.py`` fails when Lightning or
torch change that decision.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

from lightning_gaudi.patches import registry

_AMP = "lightning.fabric.plugins.precision.amp"
#: Lightning's predicate: whether an optimizer unscales its gradients inside ``step()``.
PREDICATE = f"{_AMP}._optimizer_handles_unscaling"
#: Lightning's methods that skip unscaling (``optimizer_step``) or refuse clipping (``clip_gradients``) on it.
READERS = (
    "lightning.pytorch.plugins.precision.amp.MixedPrecision.optimizer_step",
    "lightning.pytorch.plugins.precision.amp.MixedPrecision.clip_gradients",
)


class _State:
    enabled = False


def _predicate() -> Any:
    try:  # looked up when called: a Lightning that moved it must still import lightning_gaudi
        return getattr(importlib.import_module(_AMP), PREDICATE.rpartition(".")[2], None)
    except ImportError:
        return None


def missing_targets() -> list[str]:
    """What this relies on and this Lightning lacks or no longer uses; empty when everything is as checked."""
    if not callable(_predicate()):
        return [PREDICATE]
    from lightning.pytorch.plugins.precision import MixedPrecision

    name = PREDICATE.rpartition(".")[2]
    missing = []
    for reader in READERS:
        code = getattr(getattr(MixedPrecision, reader.rpartition(".")[2], None), "__code__", None)
        if code is None or name not in code.co_names:
            missing.append(reader)
    return missing


def installed() -> bool:
    """Whether :func:`unscales_in_step` was checked against this Lightning."""
    return _State.enabled


def install() -> bool:
    """Checks Lightning's fp16 plugin (idempotent). Returns whether :func:`unscales_in_step` may be used.

    On a Lightning outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or whose plugin decides
    otherwise, a warning says what still works.
    """
    if _State.enabled:
        return True
    supported = registry.LIGHTNING_SUPPORTED
    missing = missing_targets()
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" missing: {missing or 'nothing'}). With precision='16-mixed', fused optimizers cannot be clipped"
            " (Lightning refuses); everything else works.",
            stacklevel=2,
        )
        return False
    _State.enabled = True
    return True


def unscales_in_step(optimizer: Any) -> bool:
    """Whether Lightning leaves ``optimizer``'s gradients scaled until its ``step()`` (torch's fused optimizers).

    Raises:
        RuntimeError: this Lightning was not checked (:func:`installed` is false).
    """
    if not installed():
        raise RuntimeError(
            f"lightning_gaudi reads Lightning's `{PREDICATE}` only on {registry.SUPPORTED_LIGHTNING}"
            f" (missing or changed: {missing_targets() or 'nothing'};"
            f" {registry.LIGHTNING_SUPPORTED.message or 'version ok'})."
        )
    return bool(_predicate()(optimizer))


PATCH = registry.Patch(
    name="amp_unscaling",
    targets=(PREDICATE, *READERS),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
