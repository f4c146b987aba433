"""What :class:`~lightning_gaudi.strategies.HPUDeepSpeedStrategy` relies on inside Lightning's CUDA-only
``DeepSpeedStrategy`` (:data:`METHODS`); nothing is patched globally."""

from __future__ import annotations

import inspect
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from lightning.pytorch.strategies import DeepSpeedStrategy

from lightning_gaudi.patches import registry

_CLASS = f"{DeepSpeedStrategy.__module__}.{DeepSpeedStrategy.__qualname__}"
#: The methods relied on, with their parameters after ``self``.
METHODS: dict[str, tuple[str, ...]] = {
    "init_deepspeed": (),
    "_setup_model_and_optimizer": ("model", "optimizer", "lr_scheduler"),
    "_initialize_deepspeed_train": ("model",),
    "_format_batch_size_and_grad_accum_config": (),
    "setup_environment": (),
    "setup_distributed": (),
}


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


def check_supported() -> None:
    """Raises unless this Lightning's ``DeepSpeedStrategy`` is as checked (the HPU strategy replaces some steps)."""
    missing = missing_targets()
    if missing or not registry.LIGHTNING_SUPPORTED:
        raise RuntimeError(
            f"HPUDeepSpeedStrategy was checked against {registry.SUPPORTED_LIGHTNING}'s DeepSpeedStrategy; this"
            f" Lightning differs (missing or changed: {missing or 'nothing'};"
            f" {registry.LIGHTNING_SUPPORTED.message or 'version ok'})."
        )


@contextmanager
def device_rank(local_rank: int) -> Iterator[None]:
    """Within it, ``deepspeed.initialize`` given ``args.device_rank=None`` gets ``local_rank`` instead."""
    import deepspeed

    initialize = deepspeed.initialize

    def with_device_rank(*args: Any, **kwargs: Any) -> Any:
        namespace = kwargs.get("args")
        if namespace is not None and getattr(namespace, "device_rank", 0) is None:
            namespace.device_rank = local_rank
        return initialize(*args, **kwargs)

    deepspeed.initialize = with_device_rank
    try:
        yield
    finally:
        deepspeed.initialize = initialize


def waits_on_a_lock_file() -> bool:
    """Whether torch builds extensions under ``cpp_extension.FileBaton``, a lock file that a killed build leaves behind
    (up to torch 2.13); from 2.14 torch holds an OS-level lock, which ends with the process holding it."""
    from torch.utils import cpp_extension

    return hasattr(cpp_extension, "FileBaton")


@contextmanager
def bounded_build_lock(timeout: timedelta) -> Iterator[None]:
    """Within it, torch's endless wait for the lock file of a DeepSpeed op build (``cpp_extension.FileBaton``) fails
    after ``timeout`` with a ``TimeoutError`` naming it (where torch has such a lock: :func:`waits_on_a_lock_file`)."""
    from torch.utils import cpp_extension

    if not waits_on_a_lock_file():
        yield
        return

    class BoundedBaton(cpp_extension.FileBaton):
        def wait(self) -> None:
            deadline = time.monotonic() + timeout.total_seconds()
            while os.path.exists(path := self.lock_file_path):
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"Waited {timeout.total_seconds():g}s (the strategy's `timeout`) for {path!r}, the lock torch"
                        " takes to build or load a DeepSpeed op. A job killed in its set-up leaves it stale: unless a"
                        f" job here is building the op (then give it a longer `timeout`), remove it: `rm {path}`."
                    )
                time.sleep(self.wait_seconds)

    baton, cpp_extension.FileBaton = cpp_extension.FileBaton, BoundedBaton  # type: ignore[misc]
    try:
        yield
    finally:
        cpp_extension.FileBaton = baton  # type: ignore[misc]
