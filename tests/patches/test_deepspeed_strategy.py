"""The DeepSpeed-strategy patch (``lightning_gaudi/patches/deepspeed_strategy.py``): the steps of Lightning's
``DeepSpeedStrategy`` that ``HPUDeepSpeedStrategy`` replaces.

The canaries fail when Lightning changes those methods or stops calling ``_setup_model_and_optimizer`` to build the
engine, or when its CUDA refusal moves (then the HPU strategy's bypass of it needs a look).
"""

from __future__ import annotations

import functools
import inspect
import types
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUDeepSpeedStrategy
from lightning_gaudi.patches import deepspeed_strategy, registry


def test_lightnings_methods_are_as_checked() -> None:
    """Canary: the methods relied on, with their parameters, and the engine built through the overridden one."""
    assert deepspeed_strategy.missing_targets() == [], "Lightning changed DeepSpeedStrategy's steps replaced here"
    assert "only supported on CUDA GPUs" in inspect.getsource(DeepSpeedStrategy.setup_environment)
    assert "deepspeed.initialize(" in inspect.getsource(DeepSpeedStrategy._setup_model_and_optimizer)
    assert "device_rank=self.root_device.index" in inspect.getsource(DeepSpeedStrategy._setup_model_and_optimizer)
    assert '"gradient_clipping" not in self.config' in inspect.getsource(
        DeepSpeedStrategy._format_batch_size_and_grad_accum_config
    )
    assert DeepSpeedStrategy.__mro__[1] is DDPStrategy  # the HPU strategy runs DDPStrategy.setup_environment


class _Built(Exception):
    pass


def test_lightning_builds_the_engine_with_the_root_devices_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary, running Lightning's code: the training engine is built through ``_setup_model_and_optimizer``, which
    gives DeepSpeed the root device's index as its device rank (``None`` on the HPU: what the HPU strategy replaces)."""
    deepspeed = pytest.importorskip("deepspeed")
    seen: dict[str, Any] = {}

    def initialize(args: Any, **kwargs: Any) -> None:
        seen.update(device_rank=args.device_rank, config=kwargs["config"])
        raise _Built

    monkeypatch.setattr(deepspeed, "initialize", initialize)
    stand_in = types.SimpleNamespace(config={"optimizer": {}}, root_device=torch.device("cpu"))
    stand_in._setup_model_and_optimizer = functools.partial(DeepSpeedStrategy._setup_model_and_optimizer, stand_in)
    with pytest.raises(_Built):
        DeepSpeedStrategy._initialize_deepspeed_train(stand_in, torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    assert seen == {"device_rank": None, "config": stand_in.config}


def test_the_hpu_strategy_overrides_what_it_says() -> None:
    for name in ("setup_environment", "setup_distributed", "init_deepspeed"):
        assert name in vars(HPUDeepSpeedStrategy), name


def test_a_changed_lightning_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def changed(self, model, optimizer):  # type: ignore[no-untyped-def]
        raise AssertionError

    monkeypatch.setattr(DeepSpeedStrategy, "_setup_model_and_optimizer", changed)
    assert deepspeed_strategy.missing_targets() == [
        "lightning.pytorch.strategies.deepspeed.DeepSpeedStrategy._setup_model_and_optimizer(self, model, optimizer,"
        " lr_scheduler)"
    ]


def test_refuses_a_changed_or_unsupported_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    deepspeed_strategy.check_supported()
    monkeypatch.setattr(registry, "LIGHTNING_SUPPORTED", RequirementCache("lightning<1.0"))
    with pytest.raises(RuntimeError, match=r"HPUDeepSpeedStrategy was checked against lightning>=2.5.6.*nothing"):
        deepspeed_strategy.check_supported()
    monkeypatch.undo()
    monkeypatch.delattr(DeepSpeedStrategy, "setup_distributed")
    with pytest.raises(RuntimeError, match=r"changed: \[.*setup_distributed\(self, \)'\]; Requirement"):
        HPUDeepSpeedStrategy()


def test_torch_waits_for_a_build_lock_through_the_baton_replaced(tmp_path: Path) -> None:
    """Canary for :func:`~lightning_gaudi.patches.deepspeed_strategy.bounded_build_lock`: torch builds and loads an
    extension (a DeepSpeed op) under ``cpp_extension``'s ``FileBaton`` on ``<build dir>/lock`` and waits for it with
    ``wait()``; the replacement stops waiting after the timeout and is put back after."""
    from torch.utils import cpp_extension
    from torch.utils.file_baton import FileBaton

    if not deepspeed_strategy.waits_on_a_lock_file():
        pytest.skip("this torch locks extension builds with an OS-level lock: see the test below")
    source = inspect.getsource(cpp_extension._jit_compile)
    assert "baton = FileBaton(os.path.join(build_directory, 'lock'))" in source
    assert "baton.wait()" in source
    lock = tmp_path / "lock"
    lock.touch()
    with deepspeed_strategy.bounded_build_lock(timedelta(seconds=0.2)):
        with pytest.raises(TimeoutError, match=r"Waited 0.2s"):
            cpp_extension.FileBaton(str(lock)).wait()
        lock.unlink()
        cpp_extension.FileBaton(str(lock)).wait()  # no lock: returns at once
    assert cpp_extension.FileBaton is FileBaton


def test_without_a_baton_the_build_lock_is_left_to_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.14 on: ``_jit_compile`` holds an OS-level ``FileLock`` that ends with the process holding it, so the
    file a killed build leaves blocks nothing, and :func:`bounded_build_lock` changes nothing."""
    from torch.utils import cpp_extension

    if deepspeed_strategy.waits_on_a_lock_file():
        monkeypatch.delattr(cpp_extension, "FileBaton")  # the same branch, on a torch that still has the baton
        assert not deepspeed_strategy.waits_on_a_lock_file()
    else:
        assert "with FileLock(os.path.join(build_directory, 'lock')):" in inspect.getsource(cpp_extension._jit_compile)
        lock = tmp_path / "lock"
        lock.touch()  # left by a killed build
        with cpp_extension.FileLock(str(lock), timeout=1):
            pass
    before = dict(vars(cpp_extension))
    with deepspeed_strategy.bounded_build_lock(timedelta(seconds=0.2)):
        assert dict(vars(cpp_extension)) == before
