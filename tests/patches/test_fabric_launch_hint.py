"""The fabric_launch_hint patch (``lightning_gaudi/patches/fabric_launch_hint.py``): Fabric's refusal of an unlaunched
multi-device job names ``python -m lightning_gaudi fabric run`` on the HPU.

The canary runs the patched path: ``fabric.setup`` on 2 emulated HPUs without ``.launch()`` must still stop with
Lightning's refusal, raised by ``Fabric._validate_launched``, and carry the HPU's command.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from lightning.fabric import Fabric

from lightning_gaudi import hpu
from lightning_gaudi.fabric import RUN_COMMAND
from lightning_gaudi.patches import fabric_launch_hint, registry

UPSTREAM = "lightning.fabric.fabric.Fabric._validate_launched"


def test_installed_after_import() -> None:
    assert fabric_launch_hint.installed()
    assert fabric_launch_hint.missing_targets() == []
    assert fabric_launch_hint.PATCH.targets == (UPSTREAM,)


@pytest.mark.parametrize("call", ["setup", "setup_module", "setup_dataloaders"])
def test_an_unlaunched_hpu_job_is_refused_naming_the_hpu_command(eager_hpu: hpu.Backend, call: str) -> None:
    """Canary: Lightning still refuses through ``_validate_launched``, and the refusal names the HPU's command."""
    fabric = Fabric(accelerator="hpu", devices=2)
    target = torch.utils.data.DataLoader(range(4)) if call == "setup_dataloaders" else torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError) as error:
        getattr(fabric, call)(target)
    message = str(error.value)
    assert message.startswith(fabric_launch_hint.REFUSAL), f"{UPSTREAM} no longer refuses with {message!r}"
    assert f"`{RUN_COMMAND} --accelerator hpu --devices 2 SCRIPT [ARGS...]`" in message
    assert any(entry.name == "_validate_launched" for entry in error.traceback), f"no longer raised by {UPSTREAM}"


def test_several_nodes_are_named(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(RuntimeError, match="--devices 2 --num-nodes 2 --node-rank R --main-address HOST SCRIPT"):
        Fabric(accelerator="hpu", devices=2, num_nodes=2).setup(torch.nn.Linear(2, 2))


def test_other_accelerators_keep_lightnings_message() -> None:
    with pytest.raises(RuntimeError) as error:
        Fabric(accelerator="cpu", devices=2).setup(torch.nn.Linear(2, 2))
    assert str(error.value) == (
        "To use Fabric with more than one device, you must call `.launch()` or use the CLI: `fabric run --help`."
    ), "Lightning changed its refusal: check fabric_launch_hint.REFUSAL"


def test_one_device_is_not_refused(eager_hpu: hpu.Backend) -> None:
    Fabric(accelerator="hpu", devices=1).setup(torch.nn.Linear(2, 2))


def _uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Fabric, "_validate_launched", Fabric._validate_launched.__wrapped__)  # type: ignore[attr-defined]
    assert not fabric_launch_hint.installed()


def test_a_changed_refusal_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    _uninstall(monkeypatch)

    def validate(self: Fabric) -> None:
        raise RuntimeError("Launch first.")

    monkeypatch.setattr(Fabric, "_validate_launched", validate)
    with pytest.warns(UserWarning, match=r"_validate_launched raising.*python -m lightning_gaudi fabric run"):
        assert fabric_launch_hint.install() is False
    assert not fabric_launch_hint.installed()


def test_unsupported_lightning_is_left_unpatched(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_utilities.core.imports import RequirementCache

    _uninstall(monkeypatch)
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    with pytest.warns(UserWarning, match="fabric run"):
        assert fabric_launch_hint.install() is False


def test_installs_once_and_again_after_uninstall(monkeypatch: pytest.MonkeyPatch) -> None:
    before = Fabric.__dict__["_validate_launched"]
    assert fabric_launch_hint.install() is True
    assert Fabric.__dict__["_validate_launched"] is before
    _uninstall(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fabric_launch_hint.install() is True
    assert fabric_launch_hint.installed()
