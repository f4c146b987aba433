"""The fabric_compile patch (``lightning_gaudi/patches/fabric_compile.py``): a model ``torch.compile``d before
``fabric.setup`` (LitGPT's pretraining) is compiled again with the execution mode's backend on an HPU strategy.

The canaries run the patched path: Fabric must still read the record the patch fills in, and compile with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from lightning.fabric import Fabric
from torch import nn

from lightning_gaudi import hpu
from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV
from lightning_gaudi.patches import fabric_compile

BACKEND = "lightning_gaudi_test_recording"
CALLS: list[str] = []


@pytest.fixture(scope="module", autouse=True)
def _recording_backend() -> None:
    from torch._dynamo import list_backends, register_backend

    if BACKEND in list_backends(exclude_tags=()):
        return

    @register_backend(name=BACKEND)
    def record(graph: torch.fx.GraphModule, inputs: Any) -> Callable[..., Any]:
        CALLS.append(BACKEND)
        return graph.forward


@pytest.fixture
def calls() -> Iterator[list[str]]:
    CALLS.clear()
    torch._dynamo.reset()
    yield CALLS
    torch._dynamo.reset()


def _compiled(**kwargs: Any) -> nn.Module:
    torch.manual_seed(0)
    return torch.compile(nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)), **kwargs)  # type: ignore[return-value]


def test_installed_after_import() -> None:
    assert fabric_compile.installed()
    assert fabric_compile.missing_targets() == []
    assert fabric_compile.PATCH.targets == (
        "lightning.fabric.fabric.Fabric.setup",
        "lightning.fabric.fabric.Fabric.setup_module",
        "lightning.fabric.wrappers._unwrap_compiled",
    )


@pytest.mark.parametrize("method", ["setup", "setup_module"])
def test_hpu_recompiles_with_the_execution_modes_backend(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, calls: list[str], method: str
) -> None:
    """Canary: Fabric compiles again with the record the patch filled in."""
    monkeypatch.setenv(COMPILE_BACKEND_ENV, BACKEND)
    fabric = Fabric(accelerator="hpu", devices=1)
    model = _compiled()
    set_up = getattr(fabric, method)(model)
    backend = set_up._forward_module._compile_kwargs["backend"]
    assert backend.backend == BACKEND  # compiled once per node (compile_cache.NodeCompile)
    set_up(torch.ones(2, 4))
    assert calls == [BACKEND], "Fabric no longer compiles with the arguments read from `_compile_kwargs`"


def test_a_backend_the_user_passed_is_kept(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILE_BACKEND_ENV, BACKEND)
    set_up = Fabric(accelerator="hpu", devices=1).setup(_compiled(backend="eager"))
    assert set_up._forward_module._compile_kwargs == {"backend": "eager"}


def test_other_accelerators_keep_torchs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILE_BACKEND_ENV, BACKEND)
    set_up = Fabric(accelerator="cpu", devices=1).setup(_compiled(mode="default"))
    assert set_up._forward_module._compile_kwargs == {"mode": "default"}


def test_an_unknown_emulated_backend_is_named(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMPILE_BACKEND_ENV, "no_such_backend")
    with pytest.raises(ValueError, match=f"{COMPILE_BACKEND_ENV}='no_such_backend' is not a torch.compile backend"):
        Fabric(accelerator="hpu", devices=1).setup(_compiled())


def test_lazy_mode_refuses_a_compiled_model(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"lazy mode, where torch\.compile does not run"):
        Fabric(accelerator="hpu", devices=1).setup(_compiled())
    Fabric(accelerator="hpu", devices=1).setup(_compiled(backend="aot_eager"))  # a backend chosen is the user's


def test_install_is_idempotent_and_skips_an_unsupported_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = fabric_compile.fabric_class()
    assert cls is not None
    before = {name: cls.__dict__[name] for name in fabric_compile.WRAPPED}
    assert fabric_compile.install() is True
    assert before == {name: cls.__dict__[name] for name in fabric_compile.WRAPPED}

    monkeypatch.setattr(fabric_compile, "missing_targets", lambda: ["lightning.fabric.wrappers._unwrap_compiled"])
    monkeypatch.setattr(fabric_compile, "installed", lambda: False)
    with pytest.warns(UserWarning, match="compiled again with torch's default backend"):
        assert fabric_compile.install() is False
