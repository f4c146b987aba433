"""The fp8_precision_name patch (``lightning_gaudi/patches/fp8_precision_name.py``): ``precision="fp8"`` by name.

The canaries build a Trainer and a Fabric with ``precision="fp8"``, and fail when Lightning stops checking precision
names in ``_convert_precision_to_unified_args``, when the Trainer stops reading it by name, or when Lightning accepts
``"fp8"`` itself (then the patch is no longer needed).
"""

from __future__ import annotations

import importlib
import inspect

import pytest
from lightning.fabric import Fabric
from lightning.fabric import connector as fabric_connector_module
from lightning.pytorch import Trainer

from lightning_gaudi import fabric, hpu
from lightning_gaudi.fp8 import HPUFP8Precision
from lightning_gaudi.patches import fp8_precision_name, registry

trainer_connector_module = importlib.import_module("lightning.pytorch.trainer.connectors.accelerator_connector")


def test_installed_after_import() -> None:
    assert fp8_precision_name.installed()
    assert fp8_precision_name.PATCH.installed()
    assert fp8_precision_name.missing_targets() == []


def test_fp8_by_name_builds_the_fp8_plugins(eager_hpu: hpu.Backend) -> None:
    """Canary: the name passes Lightning's check in both connectors and reaches the routing policy."""
    assert type(Trainer(accelerator="hpu", devices=1, precision="fp8", logger=False).precision_plugin) is (
        HPUFP8Precision
    )
    assert type(Fabric(accelerator="hpu", devices=1, precision="fp8").strategy.precision) is fabric.HPUFP8Precision
    with pytest.raises(ValueError, match=r"`Trainer\(precision='fp8'\)` .* not on CPUAccelerator"):
        Trainer(accelerator="cpu", precision="fp8", logger=False)


def test_lightning_still_refuses_fp8_by_name() -> None:
    """Canary: Lightning's own check (under the wrapper) still refuses "fp8" and converts its own names."""
    original = fabric_connector_module._convert_precision_to_unified_args.__wrapped__
    with pytest.raises(ValueError, match="Precision 'fp8' is invalid"):
        original("fp8")
    assert original("bf16") == "bf16-mixed"


def test_both_connectors_read_the_name_from_their_module() -> None:
    """Canary: the Trainer's and Fabric's connectors call the name their module holds, when they are built."""
    for module in (fabric_connector_module, trainer_connector_module):
        code = module._Connector if hasattr(module, "_Connector") else module._AcceleratorConnector
        reads = inspect.unwrap(code._check_config_and_set_final_flags).__code__.co_names
        assert "_convert_precision_to_unified_args" in reads, module.__name__


def test_only_fp8_is_widened() -> None:
    for module in (fabric_connector_module, trainer_connector_module):
        convert = module._convert_precision_to_unified_args
        assert convert("fp8") == "fp8"
        assert convert(None) is None
        assert convert(16) == "16-mixed"
        with pytest.raises(ValueError, match="Precision 'fp16' is invalid"):
            convert("fp16")


def test_install_is_idempotent() -> None:
    before = trainer_connector_module._convert_precision_to_unified_args
    assert fp8_precision_name.install()
    assert trainer_connector_module._convert_precision_to_unified_args is before


def test_unsupported_lightning_patches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (fabric_connector_module, trainer_connector_module):
        monkeypatch.setattr(module, "_convert_precision_to_unified_args", lambda precision: precision)
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", registry.RequirementCache("lightning>=99"))
    with pytest.warns(UserWarning, match=r"`precision='fp8'` is not accepted by name: pass"):
        assert not fp8_precision_name.install()
    assert not fp8_precision_name.installed()
