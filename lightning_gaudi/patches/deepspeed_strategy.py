"""What :class:`~lightning_gaudi.strategies.HPUDeepSpeedStrategy` relies on inside Lightning's ``DeepSpeedStrategy``.

Lightning 2.6's ``lightning.pytorch.strategies.DeepSpeedStrategy`` runs on CUDA only. The HPU strategy subclasses it
and replaces three of its steps; nothing is patched globally:

- ``setup_environment`` refuses every accelerator but CUDA: the HPU strategy runs ``DDPStrategy.setup_environment``
  (the device, then ``setup_distributed``) in its place;
- ``setup_distributed`` checks CUDA device indices and lets ``deepspeed.init_distributed`` form the process group:
  the HPU strategy forms it as ``hpu_parallel`` does (HCCL or gloo, its timeout) and lets DeepSpeed adopt it;
- ``_setup_model_and_optimizer(model, optimizer, lr_scheduler=None)`` calls ``deepspeed.initialize`` with
  ``args.device_rank`` set to ``root_device.index``, which is ``None`` for the HPU (the bridge binds one card per
  process) and the emulated CPU device, and DeepSpeed's engine then fails comparing ``None >= 0``:
  :func:`initialize_engine` passes the local rank instead. Lightning calls it from ``_initialize_deepspeed_train``.

``gradient_clipping`` is set in the config before Lightning's ``_format_batch_size_and_grad_accum_config``, which
fills it only when absent. ``tests/patches/test_deepspeed_strategy.py`` fails when Lightning changes any of this.
"""

from __future__ import annotations

import argparse
import inspect
import warnings
from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy

from lightning_gaudi.patches import registry

_CLASS = f"{DeepSpeedStrategy.__module__}.{DeepSpeedStrategy.__qualname__}"
#: The methods of Lightning's DeepSpeedStrategy relied on, with their parameters after ``self``.
METHODS: dict[str, tuple[str, ...]] = {
    "_setup_model_and_optimizer": ("model", "optimizer", "lr_scheduler"),
    "_initialize_deepspeed_train": ("model",),
    "_format_batch_size_and_grad_accum_config": (),
    "setup_environment": (),
    "setup_distributed": (),
}


class _State:
    enabled = False


def missing_targets() -> list[str]:
    """What the HPU strategy relies on and this Lightning lacks or changed (empty when everything is as checked)."""
    missing = []
    for name, expected in METHODS.items():
        method = DeepSpeedStrategy.__dict__.get(name)
        if not inspect.isfunction(method) or tuple(inspect.signature(method).parameters)[1:] != expected:
            missing.append(f"{_CLASS}.{name}(self, {', '.join(expected)})")
    train = DeepSpeedStrategy.__dict__.get("_initialize_deepspeed_train")
    if inspect.isfunction(train) and "self._setup_model_and_optimizer(" not in inspect.getsource(train):
        missing.append(f"{_CLASS}._initialize_deepspeed_train -> self._setup_model_and_optimizer")
    return missing


def installed() -> bool:
    """Whether Lightning's DeepSpeedStrategy was checked and the HPU strategy may replace its steps."""
    return _State.enabled


def install() -> bool:
    """Checks Lightning's DeepSpeedStrategy (idempotent); returns whether the HPU strategy may run.

    On a Lightning outside :data:`~lightning_gaudi.patches.registry.SUPPORTED_LIGHTNING`, or whose DeepSpeedStrategy
    changed, a warning says so; creating an ``HPUDeepSpeedStrategy`` then raises.
    """
    if _State.enabled:
        return True
    supported = registry.LIGHTNING_SUPPORTED
    missing = missing_targets()
    if not supported or missing:
        warnings.warn(
            f"lightning_gaudi was checked against {registry.SUPPORTED_LIGHTNING} ({supported.message or 'ok'};"
            f" missing: {missing or 'nothing'}). HPUDeepSpeedStrategy is unavailable; every other strategy works.",
            stacklevel=2,
        )
        return False
    _State.enabled = True
    return True


def check_installed() -> None:
    """Raises when the HPU strategy may not replace Lightning's steps on this Lightning (see :func:`install`)."""
    if not installed():
        raise RuntimeError(
            f"HPUDeepSpeedStrategy was checked against {registry.SUPPORTED_LIGHTNING}'s DeepSpeedStrategy; this"
            f" Lightning differs (missing or changed: {missing_targets() or 'nothing'};"
            f" {registry.LIGHTNING_SUPPORTED.message or 'version ok'})."
        )


def initialize_engine(
    strategy: DeepSpeedStrategy, model: Any, optimizer: Any, lr_scheduler: Any = None
) -> tuple[Any, Any]:
    """``deepspeed.initialize`` as Lightning's ``_setup_model_and_optimizer`` calls it, with the device rank set to the
    process's local rank. Returns the engine and DeepSpeed's optimizer."""
    import deepspeed

    engine, deepspeed_optimizer, _, _ = deepspeed.initialize(
        args=argparse.Namespace(device_rank=strategy.local_rank),
        config=strategy.config,
        model=model,
        model_parameters=[p for p in model.parameters() if p.requires_grad],
        optimizer=optimizer,
        lr_scheduler=lr_scheduler,
        dist_init_required=False,
    )
    return engine, deepspeed_optimizer


PATCH = registry.Patch(
    name="deepspeed_strategy",
    targets=tuple(f"{_CLASS}.{name}" for name in METHODS),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
