"""Out of device memory in the bridge's words (``lightning_gaudi/hpu/oom.py``), recognised by every backend.

The messages below are written out as gaudi-pytorch-bridge v1.19.0 formats them (commit
5a56187e98684ceff3de8965ce88a284cf7d7eef): backend/synapse_helpers/device_memory.cpp:1060-1065 through
``PT_MOD_FATAL`` (pytorch_helpers/habana_helpers/logging.h:317-342), the size in MiB as ``std::ostream`` prints a
double (``%g``).
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch.utilities.memory import is_oom_error
from torch import Tensor

from lightning_gaudi import hpu
from lightning_gaudi.emulator.eager import EagerBackend
from lightning_gaudi.hpu import oom

DEVMEM = "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::25165824 (24)MB"


@pytest.mark.parametrize(
    ("nbytes", "rank", "message"),
    [
        (25165824, 0, DEVMEM),
        (1572864, 0, "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1572864 (1.5)MB"),
        (123456789, 7, "[Rank:7] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::123456789 (117.738)MB"),
        (512, 0, "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::512 (0.000488281)MB"),
        (
            2**62,
            0,
            "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::4611686018427387904 (4.39805e+12)MB",
        ),
    ],
)
def test_the_message_is_the_bridges(nbytes: int, rank: int, message: str) -> None:
    assert oom.allocation_failed_message(nbytes, rank) == message
    assert oom.is_bridge_out_of_memory(RuntimeError(message))


def test_the_rank_is_the_rank_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RANK", raising=False)
    assert oom.allocation_failed_message(1024**2).startswith("[Rank:0] ")
    monkeypatch.setenv("RANK", "12")
    assert oom.allocation_failed_message(1024**2) == (
        "[Rank:12] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1048576 (1)MB"
    )


@pytest.mark.parametrize(
    "message",
    [
        DEVMEM,
        # with the backtrace the bridge attaches (logging.cpp:178-193), shown where torch prints C++ stack traces
        f"{DEVMEM}\n[Rank:0] Habana exception raised from get_pointer at device_memory.cpp:1060",
        # the graph's scratch memory (device.cpp:1608)
        "[Rank:1] FATAL ERROR :: MODULE:PT_SYNHELPER workspace Allocation of size ::4096 failed!",
        # without the pool, PT_HPU_POOL_STRATEGY=0 (HPUAllocator.cpp:204-205); the bracket holds Synapse's description
        # of the status (synStatusGetBriefDescription, not in the bridge's source): this one is made up
        "synStatus=4 [Out of device memory] allocate failed to allocate 25165824 bytes",
    ],
    ids=["devmem", "with-backtrace", "workspace", "no-pool"],
)
def test_each_wording_of_the_bridge_is_recognised(message: str) -> None:
    assert oom.is_bridge_out_of_memory(RuntimeError(message))
    assert not oom.is_bridge_out_of_memory(ValueError(message)), "the bridge raises RuntimeError (c10::Error)"
    assert not is_oom_error(RuntimeError(message)), "Lightning recognises it now: the tuner patch may be unnecessary"


@pytest.mark.parametrize(
    "message",
    [
        "HPU out of memory",  # what the double used to say; no bridge says it
        "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Trying to access out of bounds of resource",
        "[Rank:0] FATAL ERROR :: MODULE:PT_BRIDGE Allocation failed for size::10 (9.53674e-06)MB",
        "shape mismatch",
    ],
)
def test_other_errors_are_not(message: str) -> None:
    assert not oom.is_bridge_out_of_memory(RuntimeError(message))


def test_every_backend_recognises_the_bridges_wording(bridge_double: ModuleType) -> None:
    """Emulation too (lazy emulation is eager's subclass): a model or test may raise the bridge's error, and then it
    must back off as on a Gaudi."""
    real = hpu.get_backend()
    assert not real.emulated
    for backend in (EagerBackend(1, "GAUDI2"), real):
        assert backend.is_out_of_memory(RuntimeError(DEVMEM))
        assert backend.is_out_of_memory(torch.OutOfMemoryError("torch's own"))
        assert not backend.is_out_of_memory(RuntimeError("shape mismatch"))


def test_the_emulator_words_the_hosts_refusal_like_the_bridge(eager_hpu: hpu.Backend) -> None:
    """The emulated card's memory is the host's: its refusal gets the bridge's line, after the host's own words."""
    with pytest.raises(RuntimeError) as error:
        torch.empty(2**62, dtype=torch.uint8)
    host_message = str(error.value)
    assert hpu.explain_error(error.value)
    message = str(error.value)
    assert message.startswith(host_message)
    assert "more than a GAUDI2's 96 GiB, so a Gaudi runs out too" in message
    assert message.endswith(oom.allocation_failed_message(2**62, 0))
    assert oom.is_bridge_out_of_memory(error.value)
    assert is_oom_error(error.value), "Lightning's own recognition of the host's refusal is kept"
    assert eager_hpu.is_out_of_memory(error.value)
    assert not hpu.explain_error(error.value), "said once"
    assert not eager_hpu.explain_error(RuntimeError(DEVMEM)), "the bridge's own error is left as it is"


def test_a_refusal_the_card_would_grant_says_so(eager_hpu: hpu.Backend) -> None:
    size = 2**30
    error = RuntimeError(
        "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate memory: you tried to"
        f" allocate {size} bytes. Error code 12 (Cannot allocate memory)"
    )
    assert eager_hpu.explain_error(error)
    assert "within a GAUDI2's 96 GiB: the host has less free memory than the card" in str(error)
    assert str(error).endswith(
        "[Rank:0] FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed for size::1073741824 (1024)MB"
    )


class HostRefuses(Workload):
    def train_dataloader(self) -> Any:
        return loader(1)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        torch.empty(2**62, dtype=torch.uint8)  # more than any host has: the allocator refuses at once
        return super().training_step(batch, batch_idx)


def test_a_fit_that_runs_out_in_emulation_quotes_the_bridge(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    """The strategy explains the error on its way out of ``fit``: the host's words, then the bridge's."""
    trainer = quiet_trainer(default_root_dir=tmp_path, max_steps=1)
    with pytest.raises(RuntimeError) as error:
        trainer.fit(HostRefuses())
    assert "DefaultCPUAllocator: can't allocate memory" in str(error.value)
    assert str(error.value).endswith(oom.allocation_failed_message(2**62, 0))
