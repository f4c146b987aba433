"""HPU out-of-memory errors in Lightning's batch-size search: the module's ``is_oom_error``, which its scaling loops
look up on every ``RuntimeError``, also asks the HPU backend."""

from __future__ import annotations

import functools
from collections.abc import Callable

from lightning_gaudi import hpu
from lightning_gaudi.patches import registry

_MODULE = "lightning.pytorch.tuner.batch_size_scaling"
_NAME = "is_oom_error"
#: The scaling loops that look up :data:`_NAME` in :data:`_MODULE` when an error comes.
READERS = ("_run_power_scaling", "_run_binsearch_scaling")
#: Their names in Lightning 2.5 (the same loop, renamed in 2.6).
_FORMERLY = {"_run_binsearch_scaling": "_run_binary_scaling"}
_MARK = "__lightning_gaudi_hook__"


def _readers() -> tuple[str, ...]:
    module = registry.lookup(_MODULE)
    return tuple(name if hasattr(module, name) else _FORMERLY.get(name, name) for name in READERS)


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks; empty when everything is as checked."""
    module = registry.lookup(_MODULE)
    if module is None or not callable(getattr(module, _NAME, None)):
        return [f"{_MODULE}.{_NAME}"]
    missing = []
    for reader in _readers():
        code = getattr(getattr(module, reader, None), "__code__", None)
        if code is None or _NAME not in code.co_names:
            missing.append(f"{_MODULE}.{reader} using {_NAME}")
    return missing


def is_hpu_out_of_memory(error: BaseException) -> bool:
    """Whether the HPU backend takes ``error`` for running out of device memory (``False`` without an HPU)."""
    try:
        backend = hpu.get_backend()
    except (hpu.HPUUnavailableError, ValueError):
        return False
    return backend.is_out_of_memory(error)


def _wrap(original: Callable[[BaseException], bool]) -> Callable[[BaseException], bool]:
    @functools.wraps(original)
    def is_oom_error(exception: BaseException) -> bool:
        return original(exception) or is_hpu_out_of_memory(exception)

    setattr(is_oom_error, _MARK, True)
    return is_oom_error


def installed() -> bool:
    """Whether the batch-size search recognises HPU out-of-memory errors."""
    module = registry.lookup(_MODULE)
    return module is not None and getattr(getattr(module, _NAME, None), _MARK, False)


def install() -> bool:
    """Makes the batch-size search recognise HPU out-of-memory errors (idempotent); returns whether it does."""
    if installed():
        return True
    fallback = (
        "The batch-size search (`Tuner.scale_batch_size`) stops at an HPU out-of-memory error instead of backing off:"
        " pass the batch size yourself; everything else works."
    )
    if not registry.supported(missing_targets(), fallback):
        return False
    module = registry.lookup(_MODULE)
    setattr(module, _NAME, _wrap(getattr(module, _NAME)))
    return True


PATCH = registry.Patch(
    name="tuner_oom",
    targets=(f"{_MODULE}.{_NAME}", *(f"{_MODULE}.{reader}" for reader in _readers())),
    requirement=registry.SUPPORTED_LIGHTNING,
    install=install,
    installed=installed,
)
