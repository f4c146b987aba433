"""The HPU runtime: one typed value for every setting read when the bridge or the emulator starts, applied once,
before the bridge loads, and read back from the environment by one parser."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from lightning_gaudi import hpu
from lightning_gaudi.hpu.autocast_lists import BF16_LIST_ENV, FP32_LIST_ENV, LEGACY_ENV
from lightning_gaudi.hpu.runtime import INT64_ENV, LAZY_MODE_ENV, RECIPE_CACHE_ENV, RecipeCache, Runtime, configure

_BRIDGE_VARIABLES = (LAZY_MODE_ENV, INT64_ENV, RECIPE_CACHE_ENV, BF16_LIST_ENV, FP32_LIST_ENV, *LEGACY_ENV.values())


@pytest.fixture
def runtime_env(isolated_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No runtime variable set; the whole environment restored afterwards."""
    for name in _BRIDGE_VARIABLES:
        isolated_env.delenv(name, raising=False)
    return isolated_env


@pytest.mark.parametrize(
    "recipe_cache",
    ["/tmp/recipes,TRUE,2048", {"path": "/tmp/recipes", "delete_on_start": True, "max_size_mb": 2048}],
)
@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_bridge_settings_reach_the_bridge(
    bridge_double: ModuleType, runtime_env: pytest.MonkeyPatch, recipe_cache: Any
) -> None:
    settings = configure(execution_mode="eager", int64_support=True, recipe_cache=recipe_cache)
    assert os.environ[LAZY_MODE_ENV] == "0"
    assert os.environ[INT64_ENV] == "1"
    assert os.environ[RECIPE_CACHE_ENV] == "/tmp/recipes,true,2048"
    assert settings == Runtime(emulate=False, execution_mode="eager", int64_support=True, recipe_cache=recipe_cache)
    assert not hpu.get_backend().is_lazy(), "the bridge reads PT_HPU_LAZY_MODE when it loads"


@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_settings_after_the_bridge_loaded_are_an_error(
    bridge_double: ModuleType, runtime_env: pytest.MonkeyPatch
) -> None:
    configure(execution_mode="lazy")
    hpu.get_backend().is_available()  # loads the bridge
    assert hpu.bridge_loaded()
    configure(execution_mode="lazy")  # already in effect: nothing to change
    with pytest.raises(RuntimeError, match=r"already loaded, so PT_HPU_LAZY_MODE can no longer take effect"):
        configure(execution_mode="eager")
    assert os.environ[LAZY_MODE_ENV] == "1"
    with pytest.raises(RuntimeError, match=r"PT_HPU_AUTOCAST_FP32_OPS_LIST.*before building the Trainer"):
        configure(autocast_fp32_ops=["softmax"])


@pytest.mark.double_only("needs a bridge not loaded yet (Intel's loads once per process; the double, per test)")
def test_autocast_lists_become_the_bridges_list_files(
    bridge_double: ModuleType, runtime_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    configure(autocast_bf16_ops=["linear", "matmul"], autocast_fp32_ops=["softmax"], autocast_list_dir=str(tmp_path))
    assert Path(os.environ[BF16_LIST_ENV]).read_text().split() == ["linear", "matmul"]
    assert Path(os.environ[FP32_LIST_ENV]).read_text().split() == ["softmax"]
    assert os.environ[LEGACY_ENV[BF16_LIST_ENV]] == os.environ[BF16_LIST_ENV]
    assert Path(os.environ[FP32_LIST_ENV]).parent == tmp_path
    hpu.get_backend().is_available()
    read_back = Runtime.from_env()
    assert (read_back.autocast_bf16_ops, read_back.autocast_fp32_ops) == (("linear", "matmul"), ("softmax",))
    configure(autocast_bf16_ops=["linear", "matmul"])  # the same list after load: nothing to change


def test_auto_emulation(runtime_env: pytest.MonkeyPatch) -> None:
    runtime_env.setattr(hpu.runtime, "bridge_installed", lambda: False)
    assert configure().emulate is True
    assert os.environ[hpu.EMULATE_ENV] == "eager"
    runtime_env.setenv(hpu.EMULATE_ENV, "lazy")
    assert configure().execution_mode == "lazy"  # the user's variable is kept
    assert configure(execution_mode="eager").execution_mode == "eager"  # an explicit setting wins
    runtime_env.delenv(hpu.EMULATE_ENV)
    runtime_env.setattr(hpu.runtime, "bridge_installed", lambda: True)
    assert configure().emulate is False
    assert hpu.EMULATE_ENV not in os.environ


def test_from_env_reads_what_configure_wrote(runtime_env: pytest.MonkeyPatch) -> None:
    wanted = Runtime(emulate=True, execution_mode="lazy", emulated_devices=2, emulated_device_name="gaudi3")
    assert configure(wanted) == wanted.replace(emulated_device_name="GAUDI3")
    assert hpu.get_backend().device_name() == "GAUDI3"


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: RecipeCache.parse("/tmp/r,maybe,10"), r"delete_on_start \(field 2\)='maybe'"),
        (lambda: RecipeCache.parse("/tmp/r,true,1,true,x"), "takes 1 to 4"),
        (lambda: RecipeCache.parse("/tmp/r,true,-5"), r"max_MB \(field 3\)='-5'"),
        (lambda: RecipeCache.parse("/tmp/r ,true,5"), "surrounding spaces"),
        (lambda: RecipeCache.parse({"path": "/tmp/r", "size": 5}), r"unknown: \['size'\]"),
        (lambda: RecipeCache("/tmp/r", max_size_mb=-1), "max_size_mb=-1"),
        (lambda: configure(int64_support="sometimes"), "int64_support='sometimes'"),
        (lambda: configure(execution_mode="graph"), "execution_mode='graph'"),
        (lambda: configure(emulated_devices=0), "emulated_devices=0"),
        (lambda: configure(emulated_device_name="GAUDI9"), "GAUDI, GAUDI2, GAUDI3"),
        (lambda: configure(autocast_bf16_ops=["gelu"], autocast_fp32_ops=["gelu"]), r"\['gelu'\] are in both"),
        (lambda: configure(recipe_cache="/tmp/r,true,10", autocast_fp32_ops=["sofmax"]), "Did you mean 'softmax'"),
    ],
)
def test_malformed_settings_change_nothing(
    runtime_env: pytest.MonkeyPatch, make: Callable[[], Any], match: str
) -> None:
    before = dict(os.environ)
    with pytest.raises(ValueError, match=match):
        make()
    assert dict(os.environ) == before


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        (hpu.EMULATE_ENV, "fast", "not an emulation mode"),
        (hpu.DEVICES_ENV, "two", "positive integer"),
        (LAZY_MODE_ENV, "yes", "accepts PT_HPU_LAZY_MODE=0 .* or PT_HPU_LAZY_MODE=1"),
        (INT64_ENV, "2", "accepts 1, true, 0 or false"),
    ],
)
def test_malformed_variables_name_themselves(
    runtime_env: pytest.MonkeyPatch, variable: str, value: str, match: str
) -> None:
    runtime_env.setenv(variable, value)
    with pytest.raises(ValueError, match=match) as info:
        Runtime.from_env()
    assert variable in str(info.value)


def test_configure_takes_a_runtime_or_keywords_not_both() -> None:
    with pytest.raises(TypeError, match="not both"):
        configure(Runtime(), emulate=True)
