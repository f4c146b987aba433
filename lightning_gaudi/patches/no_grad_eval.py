"""Evaluation under ``torch.no_grad`` instead of ``torch.inference_mode``, for one trainer (Lazy Tensor Core cannot
trace ``inference_mode``): the evaluation loops store the flag and ``_no_grad_context`` reads it each time they run.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning_gaudi.patches import registry
from lightning_gaudi.patches._checked import Checked

EVALUATION_LOOPS = ("validate_loop", "test_loop", "predict_loop")
#: (module, class) of the loops whose ``__init__`` takes and stores ``inference_mode``.
LOOP_CLASSES = (
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop"),
    ("lightning.pytorch.loops.prediction_loop", "_PredictionLoop"),
)
NO_GRAD_CONTEXT = "lightning.pytorch.loops.utilities._no_grad_context"


def missing_targets() -> list[str]:
    """The loop classes (or their ``inference_mode`` parameter) this Lightning lacks; empty when all are there."""
    missing = []
    for module_name, class_name in LOOP_CLASSES:
        loop = registry.lookup(module_name, class_name)
        if loop is None:
            missing.append(f"{module_name}.{class_name}")
        elif "inference_mode" not in inspect.signature(loop.__init__).parameters:
            missing.append(f"{module_name}.{class_name}(inference_mode=...)")
    return missing


_State = Checked(
    missing_targets,
    "Under lazy emulation evaluation cannot switch off torch.inference_mode by itself: pass"
    " `Trainer(inference_mode=False)`.",
)
#: Whether :func:`disable_inference_mode` was checked against this Lightning; :func:`install` checks it (idempotent).
installed, install = _State.installed, _State.install


def disable_inference_mode(trainer: Any) -> None:
    """Makes ``trainer``'s evaluation loops use ``torch.no_grad`` instead of ``torch.inference_mode``;
    ``RuntimeError`` where the loops lack the flag or this Lightning was not checked."""
    loops = []
    for name in EVALUATION_LOOPS:
        loop = getattr(trainer, name, None)
        if loop is None or not isinstance(getattr(loop, "inference_mode", None), bool):
            raise RuntimeError(
                f"lightning_gaudi expected `trainer.{name}.inference_mode` ({registry.SUPPORTED_LIGHTNING});"
                " this Lightning lacks it. Pass `Trainer(inference_mode=False)` instead."
            )
        loops.append(loop)
    if not any(loop.inference_mode for loop in loops):
        return  # Trainer(inference_mode=False): nothing to change
    if not installed():
        raise RuntimeError(
            f"lightning_gaudi switches off the evaluation loops' inference mode only on {registry.SUPPORTED_LIGHTNING}"
            f" ({registry.LIGHTNING_SUPPORTED.message or 'not checked'}). Pass `Trainer(inference_mode=False)`."
        )
    for loop in loops:
        loop.inference_mode = False


PATCH = _State.patch("no_grad_eval", (*(f"{module}.{cls}.__init__" for module, cls in LOOP_CLASSES), NO_GRAD_CONTEXT))
