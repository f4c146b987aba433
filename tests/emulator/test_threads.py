"""The emulator's thread policy: one torch thread per process unless the user chose (``OMP_NUM_THREADS``,
``MKL_NUM_THREADS`` or ``torch.set_num_threads``). On a shared 2-core machine torch's default (a thread per core)
ran the README's job 2.8 to 3.9 times slower (measured with the former ``benchmarks/threads.py``); DDP ranks get their
share from Lightning."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from lightning_gaudi import hpu
from lightning_gaudi.emulator import eager


@pytest.fixture
def torch_default_threads(clean_hpu_env: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """torch at what it takes for its default thread count (3 here), no thread variable set; restored afterwards."""
    before = torch.get_num_threads()
    for name in eager.THREAD_VARIABLES:
        clean_hpu_env.delenv(name, raising=False)
    clean_hpu_env.setattr(eager, "torch_default_threads", lambda: 3)
    torch.set_num_threads(3)
    yield clean_hpu_env
    torch.set_num_threads(before)


@pytest.mark.parametrize("mode", ["eager", "lazy"])
def test_emulation_runs_one_thread_when_nobody_chose(torch_default_threads: pytest.MonkeyPatch, mode: str) -> None:
    torch_default_threads.setenv(hpu.EMULATE_ENV, mode)
    hpu.get_backend()
    assert torch.get_num_threads() == eager.EMULATED_THREADS == 1
    torch.set_num_threads(2)  # the user's call after the backend exists wins, and nothing resets it
    hpu.get_backend()
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("variable", ["OMP_NUM_THREADS", "MKL_NUM_THREADS"])
def test_a_thread_variable_is_the_users_choice(torch_default_threads: pytest.MonkeyPatch, variable: str) -> None:
    torch_default_threads.setenv(variable, "3")
    torch_default_threads.setenv(hpu.EMULATE_ENV, "eager")
    hpu.get_backend()
    assert torch.get_num_threads() == 3


def test_set_num_threads_before_the_trainer_is_the_users_choice(torch_default_threads: pytest.MonkeyPatch) -> None:
    torch.set_num_threads(2)
    torch_default_threads.setenv(hpu.EMULATE_ENV, "eager")
    hpu.get_backend()
    assert torch.get_num_threads() == 2


def test_torch_default_is_the_physical_core_count(tmp_path: pytest.TempPathFactory) -> None:
    """What torch's default thread count is (cpuinfo's physical cores), read like torch reads it."""
    hyperthreaded = "\n\n".join(
        f"processor\t: {n}\nphysical id\t: {n // 4}\ncore id\t\t: {n % 2}\nsiblings\t: 4" for n in range(8)
    )
    assert eager.physical_cores(hyperthreaded) == 4  # 2 sockets x 2 cores x 2 threads
    assert eager.physical_cores("processor\t: 0\n\nprocessor\t: 1\n") is None  # no core ids: unknown
    assert eager.torch_default_threads() >= 1


def test_the_hpu_line_names_the_threads(torch_default_threads: pytest.MonkeyPatch) -> None:
    torch_default_threads.setenv(hpu.EMULATE_ENV, "eager")
    assert "EMULATED on the CPU in eager mode, 1 torch thread)" in hpu.device_summary(1, "SingleHPUStrategy")
