"""Evaluation under ``torch.no_grad`` instead of ``torch.inference_mode``, for one trainer.

Lightning's evaluation and prediction loops (``_EvaluationLoop``, ``_PredictionLoop``) read their
``inference_mode`` flag each time they run (``lightning.pytorch.loops.utilities._no_grad_context``);
:func:`disable_inference_mode` turns it off on a trainer that was built with the default ``inference_mode=True``.
Lazy emulation needs it: torch's Lazy Tensor Core cannot trace ``inference_mode``.
``tests/emulation/test_no_grad_eval.py`` fails when Lightning changes the flag or where it is read.
"""

from __future__ import annotations

import inspect
from typing import Any

from lightning_gaudi.patches import registry

#: The trainer's evaluation loops, each with an ``inference_mode`` flag read when the loop runs.
EVALUATION_LOOPS = ("validate_loop", "test_loop", "predict_loop")
#: The loop classes whose ``__init__`` takes (and stores) ``inference_mode``, as (module, class).
LOOP_CLASSES = (
    ("lightning.pytorch.loops.evaluation_loop", "_EvaluationLoop"),
    ("lightning.pytorch.loops.prediction_loop", "_PredictionLoop"),
)

#: Where a running loop reads its ``inference_mode`` flag.
NO_GRAD_CONTEXT = "lightning.pytorch.loops.utilities._no_grad_context"


class _State:
    enabled = False


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


def installed() -> bool:
    """Whether :func:`disable_inference_mode` was checked against this Lightning and may switch the flag."""
    return _State.enabled


def install() -> bool:
    """Checks this Lightning's loops (idempotent). Returns whether :func:`disable_inference_mode` is enabled; if not,
    a warning says what still works (``Trainer(inference_mode=False)``)."""
    fallback = (
        "Under lazy emulation evaluation cannot switch off torch.inference_mode by itself: pass"
        " `Trainer(inference_mode=False)`."
    )
    _State.enabled = _State.enabled or registry.supported(missing_targets(), fallback)
    return _State.enabled


def disable_inference_mode(trainer: Any) -> None:
    """Makes ``trainer``'s evaluation loops use ``torch.no_grad`` instead of ``torch.inference_mode``.

    Args:
        trainer: a ``lightning.pytorch.Trainer``.

    Raises:
        RuntimeError: Lightning's loops no longer carry the ``inference_mode`` flag this relies on, or this
            Lightning was not checked (:func:`installed` is false) and the trainer still uses inference mode.
    """
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


PATCH = registry.Patch(
    name="no_grad_eval",
    # the loops take and store `inference_mode`; _no_grad_context reads it when a loop runs
    targets=(*(f"{module}.{cls}.__init__" for module, cls in LOOP_CLASSES), NO_GRAD_CONTEXT),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
