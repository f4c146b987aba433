"""Every device-dependent default for each Gaudi generation, on the emulator (``LIGHTNING_GAUDI_DEVICE_NAME``) and on
the bridge double (``get_device_name()``): the name, the memory figures, fp16 and FP8, the precisions offered; and
Gaudi software without lazy mode (stock-PyTorch images): detected and refused before the bridge loads."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from lightning_gaudi import HPUAccelerator, configure, hpu
from lightning_gaudi.hpu import runtime
from lightning_gaudi.hpu.backend import FP8_E4M3_MAX, GAUDI_MEMORY_GIB
from lightning_gaudi.precision import check_precision_supported, supported_precisions

GIB = 2**30
#: What each generation offers: fp16, FP8 (with its E4M3 range), its memory.
GENERATIONS = {
    "GAUDI": {"fp16": False, "fp8": False, "e4m3_max": None, "memory_gib": 32},
    "GAUDI2": {"fp16": True, "fp8": True, "e4m3_max": 240.0, "memory_gib": 96},
    "GAUDI3": {"fp16": True, "fp8": True, "e4m3_max": 448.0, "memory_gib": 128},
}
ALL_PRECISIONS = ("32-true", "bf16-mixed", "bf16-true", "16-mixed", "16-true", "fp8")


def _expected_precisions(name: str) -> tuple[str, ...]:
    wanted = GENERATIONS[name]
    return tuple(
        p for p in ALL_PRECISIONS if (wanted["fp16"] or not p.startswith("16-")) and (wanted["fp8"] or p != "fp8")
    )


def test_the_tables_cover_every_generation() -> None:
    assert set(GAUDI_MEMORY_GIB) == set(hpu.GAUDI_NAMES) == set(GENERATIONS)
    assert set(FP8_E4M3_MAX) == {name for name, facts in GENERATIONS.items() if facts["fp8"]}


@pytest.mark.parametrize("name", sorted(GENERATIONS))
def test_the_emulator_presents_each_generation(clean_hpu_env: pytest.MonkeyPatch, name: str) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, name)
    backend = hpu.get_backend()
    facts = GENERATIONS[name]
    assert backend.device_name() == HPUAccelerator.get_device_name() == name
    assert backend.memory_stats()["Limit"] == facts["memory_gib"] * GIB
    assert HPUAccelerator().get_device_stats("hpu")["hpu/Limit (GiB)"] == facts["memory_gib"]
    assert (backend.supports_fp16(), backend.supports_fp8(), backend.fp8_e4m3_max()) == (
        facts["fp16"],
        facts["fp8"],
        facts["e4m3_max"],
    )
    assert supported_precisions(backend) == _expected_precisions(name)
    for precision in ALL_PRECISIONS:
        if precision in _expected_precisions(name):
            check_precision_supported(precision, backend)
        else:
            with pytest.raises(ValueError, match="first-generation Gaudi"):
                check_precision_supported(precision, backend)
    assert name in hpu.device_summary(1)


def test_configure_presents_a_gaudi3(clean_hpu_env: pytest.MonkeyPatch, isolated_env: pytest.MonkeyPatch) -> None:
    configure(emulate=True, execution_mode="eager", emulated_device_name="gaudi3")
    backend = hpu.get_backend()
    assert backend.device_name() == "GAUDI3"
    assert backend.memory_stats()["Limit"] == 128 * GIB


@pytest.mark.parametrize("name", sorted(GENERATIONS))
def test_the_bridge_path_reads_each_generation(bridge_double: ModuleType, name: str) -> None:
    facts = GENERATIONS[name]
    bridge_double.configure(device_name=name, memory={"Limit": facts["memory_gib"] * GIB})
    backend = hpu.get_backend()
    assert backend.device_name() == name
    assert backend.memory_stats()["Limit"] == facts["memory_gib"] * GIB
    assert (backend.supports_fp16(), backend.supports_fp8(), backend.fp8_e4m3_max()) == (
        facts["fp16"],
        facts["fp8"],
        facts["e4m3_max"],
    )
    assert supported_precisions(backend) == _expected_precisions(name)


@pytest.fixture
def fake_bridge(clean_hpu_env: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[..., None]]:
    """Installs (on ``sys.path``) a ``habana_frameworks.torch`` package tree with the given files in its ``lib``
    folder; nothing in it is importable beyond ``habana_frameworks``."""

    def install(*libraries: str) -> None:
        package = tmp_path / "habana_frameworks"
        (package / "torch" / "lib").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "torch" / "__init__.py").write_text("raise ImportError('the fake bridge is not to be imported')\n")
        for library in libraries:
            (package / "torch" / "lib" / library).write_text("")
        clean_hpu_env.syspath_prepend(str(tmp_path))
        for name in [m for m in sys.modules if m == "habana_frameworks" or m.startswith("habana_frameworks.")]:
            clean_hpu_env.delitem(sys.modules, name)

    yield install
    for name in [m for m in sys.modules if m == "habana_frameworks" or m.startswith("habana_frameworks.")]:
        del sys.modules[name]


#: Gaudi software built on stock PyTorch: the eager plug-in only.
STOCK = ("libhabana_pytorch2_plugin.upstream.so",)


def test_a_stock_pytorch_build_has_no_lazy_mode(fake_bridge: Callable[..., None]) -> None:
    fake_bridge(*STOCK)
    why = runtime.lazy_mode_unavailable("2.10.0+cpu")
    assert why is not None
    assert "stock PyTorch (torch 2.10.0+cpu)" in why
    assert runtime.lazy_mode_unavailable() is not None  # this machine's torch is stock too


def test_intels_fork_without_the_lazy_plugin_has_no_lazy_mode(fake_bridge: Callable[..., None]) -> None:
    fake_bridge("libhabana_pytorch2_plugin.so")
    why = runtime.lazy_mode_unavailable("2.7.1a0+git1234abc")
    assert why is not None
    assert runtime.LAZY_PLUGIN in why


def test_intels_fork_with_the_lazy_plugin_has_lazy_mode(fake_bridge: Callable[..., None]) -> None:
    fake_bridge(runtime.LAZY_PLUGIN, "libhabana_pytorch2_plugin.so")
    assert runtime.lazy_mode_unavailable("2.7.1a0+git1234abc") is None


def test_without_a_bridge_or_its_lib_folder_nothing_is_claimed(bridge_double: ModuleType) -> None:
    assert runtime.lazy_mode_unavailable("2.10.0+cpu") is None  # the double has no lib folder: cannot tell


def test_lazy_mode_is_refused_before_the_bridge_loads(
    fake_bridge: Callable[..., None], isolated_env: pytest.MonkeyPatch
) -> None:
    fake_bridge(*STOCK)
    with pytest.raises(ValueError, match=r"execution_mode='lazy'.* stock PyTorch.*PT_HPU_LAZY_MODE=0.*compile"):
        configure(emulate=False, execution_mode="lazy")
    assert runtime.LAZY_MODE_ENV not in os.environ
    configure(emulate=False, execution_mode="eager")  # eager and compile mode are fine
    os.environ[runtime.LAZY_MODE_ENV] = "1"  # isolated_env puts the whole environment back
    with pytest.raises(ValueError, match=r"PT_HPU_LAZY_MODE=1 asks for lazy mode, but .*stock PyTorch"):
        hpu.get_backend()
    assert "habana_frameworks.torch" not in sys.modules
