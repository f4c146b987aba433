"""The registry of patches (``lightning_gaudi.patches``): what
``import lightning_gaudi`` installs, and where."""

from __future__ import annotations

import importlib
import warnings
from typing import Any

import lightning
import pytest
import torch
from lightning_utilities.core.imports import RequirementCache

import lightning_gaudi
from lightning_gaudi import patches
from lightning_gaudi.patches import registry

MODULES = (
    "connector",
    "sync_free_logging",
    "tuner_oom",
    "fabric_connector",
    "fabric_compile",
    "fp8_precision_name",
    "signals",
    "fabric_launch_hint",
    "launcher",
    "sharded_tensor_device",
    "no_grad_eval",
)


def _resolve(dotted: str) -> Any:
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def test_every_patch_module_is_registered() -> None:
    assert tuple(patches.PATCHES) == MODULES
    for name in MODULES:
        assert importlib.import_module(f"lightning_gaudi.patches.{name}").PATCH is patches.PATCHES[name]


def test_everything_is_installed_after_import() -> None:
    assert lightning_gaudi.patches is patches
    assert patches.installed() == dict.fromkeys(MODULES, True)


def test_install_all_is_idempotent() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert patches.install_all() == dict.fromkeys(MODULES, True)
    assert patches.installed() == dict.fromkeys(MODULES, True)


def test_installed_versions_are_the_checked_ones() -> None:
    assert registry.SUPPORTED_LIGHTNING == patches.SUPPORTED_LIGHTNING == "lightning>=2.5.6"
    assert RequirementCache(registry.SUPPORTED_LIGHTNING), (
        f"lightning {lightning.__version__} is outside {registry.SUPPORTED_LIGHTNING}: run tests/patches/ against it,"
        " re-check every Lightning patch in lightning_gaudi/patches/, then widen the range."
    )
    assert RequirementCache(registry.SUPPORTED_TORCH), (
        f"torch {torch.__version__} is outside {registry.SUPPORTED_TORCH}: re-check"
        " lightning_gaudi/patches/lr_scheduler.py (tests/patches/test_lr_scheduler.py), then widen the range."
    )


EVERY_PATCH = patches.PATCHES


@pytest.mark.parametrize("name", sorted(EVERY_PATCH))
def test_targets_exist_upstream(name: str) -> None:
    """Canary: every upstream object a patch names is still where the patch says."""
    patch = EVERY_PATCH[name]
    assert patch.targets
    assert patch.requirement in (registry.SUPPORTED_LIGHTNING, registry.SUPPORTED_TORCH)
    for target in patch.targets:
        try:
            _resolve(target)
        except (ImportError, AttributeError) as error:
            pytest.fail(f"the {name!r} patch relies on {target}, which this upstream version lacks ({error})")


def test_unsupported_versions_patch_nothing_and_warn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    monkeypatch.setattr(registry, "TORCH_SUPPORTED", RequirementCache("torch<1.0"))
    for name in MODULES:  # as on a fresh import: nothing in effect yet
        module = importlib.import_module(f"lightning_gaudi.patches.{name}")
        if hasattr(module, "_State"):
            monkeypatch.setattr(module._State, "enabled", False)
        else:
            monkeypatch.setattr(module, "installed", lambda: False)
    with pytest.warns(UserWarning, match="lightning_gaudi was checked against") as record:
        result = patches.install_all()
    assert result == dict.fromkeys(MODULES, False)
    messages = [str(warning.message) for warning in record]
    assert len(messages) == len(MODULES)
    assert all("lightning_gaudi was checked against" in message for message in messages)
