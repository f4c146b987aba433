"""Fabric's sharded saves through a storage writer the HPU strategy gives (:func:`storage_writer`): Lightning's
``_distributed_checkpoint_save(converted_state, path)`` takes none, so it is wrapped in both modules that call it."""

from __future__ import annotations

import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_gaudi.patches import registry

_MODULES = ("lightning.fabric.strategies.fsdp", "lightning.fabric.strategies.model_parallel")
_NAME = "_distributed_checkpoint_save"
_MARK = "_lightning_gaudi_storage_writer"
_FALLBACK = (
    "Fabric's sharded checkpoints are written without a checksum index (verified by their shards' lengths, as"
    " before); everything else works."
)


class _Writers:
    factory: Callable[[Path], Any] | None = None
    made: list[Any] = []


def missing_targets() -> list[str]:
    """What the patch relies on and this Lightning lacks or changed (empty when everything is as checked)."""
    functions = {module: registry.lookup(module, _NAME) for module in _MODULES}
    expected = ("converted_state", "path")
    return [
        f"{module}.{_NAME}(converted_state, path)"
        for module, function in functions.items()
        if not inspect.isfunction(function) or tuple(inspect.signature(function).parameters) != expected
    ]


def installed() -> bool:
    """Whether both modules' ``_distributed_checkpoint_save`` are the wrapper."""
    return all(getattr(registry.lookup(module, _NAME), _MARK, False) for module in _MODULES)


def install() -> bool:
    """Wraps ``_distributed_checkpoint_save`` in both modules (idempotent), else warns."""
    if installed():
        return True
    if not registry.supported(missing_targets(), _FALLBACK):
        return False
    for module in map(importlib.import_module, _MODULES):
        if not getattr(getattr(module, _NAME), _MARK, False):
            setattr(module, _NAME, _wrap(getattr(module, _NAME)))
    return True


@contextmanager
def storage_writer(factory: Callable[[Path], Any]) -> Iterator[list[Any]]:
    """Within, Fabric's sharded saves write through ``factory(path)``; yields the list of the writers made (empty
    when the patch is not installed: the saves then run as Lightning's)."""
    previous = _Writers.factory, _Writers.made
    made: list[Any] = []
    _Writers.factory, _Writers.made = factory, made
    try:
        yield made
    finally:
        _Writers.factory, _Writers.made = previous


def _wrap(original: Callable[[dict[str, Any], Path], None]) -> Callable[[dict[str, Any], Path], None]:
    @functools.wraps(original)
    def save(converted_state: dict[str, Any], path: Path) -> None:
        if _Writers.factory is None:
            return original(converted_state, path)
        import torch.distributed.checkpoint as dcp

        _Writers.made.append(_Writers.factory(path))
        dcp.save(converted_state, storage_writer=_Writers.made[-1])

    setattr(save, _MARK, True)
    return save


PATCH = registry.Patch(
    "fabric_checkpoint_writer",
    tuple(f"{module}.{_NAME}" for module in _MODULES),
    registry.SUPPORTED_LIGHTNING,
    install,
    installed,
)
