"""HPUAccelerator under eager emulation: device parsing, counts, stats, and the errors a user can meet."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from helpers.models import RegressionModel, trainer_kwargs
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import Logger

from lightning_gaudi import HPUAccelerator, HPUParallelStrategy, HPUPrecision, SingleHPUStrategy, hpu
from lightning_gaudi.hpu.backend import MEMORY_BYTE_KEYS


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        (1, [0]),
        (3, [0, 1, 2]),
        ("3", [0, 1, 2]),
        ("auto", list(range(8))),
        (-1, list(range(8))),
        ("-1", list(range(8))),
        ([1, 3], [1, 3]),
        ((7,), [7]),
        ("0,1", [0, 1]),
        (" 2, 5 ", [2, 5]),
    ],
)
def test_parse_devices(eager_hpu: hpu.Backend, devices: Any, expected: list[int]) -> None:
    assert HPUAccelerator.parse_devices(devices) == expected


@pytest.mark.parametrize(
    ("devices", "message"),
    [
        (0, "not a number of HPUs"),
        (-2, "not a number of HPUs"),
        (9, "asks for 9 HPUs but this node has 8"),
        ([8], r"index\(es\) \[8\] out of range"),
        ([0, -1], r"index\(es\) \[-1\] out of range"),
        ("0,8", r"index\(es\) \[8\] out of range"),
        ([0, 0], "more than once"),
        ([], "selects no HPU"),
        ("x", "must be an int"),
        ("0,a", "a string like .0,1."),
        (True, "must be an int"),
        (1.5, "must be an int"),
    ],
)
def test_parse_devices_rejects(eager_hpu: hpu.Backend, devices: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HPUAccelerator.parse_devices(devices)


def test_device_count_follows_the_emulation_setting(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    cores = len(os.sched_getaffinity(0))
    assert HPUAccelerator.auto_device_count() == min(cores, 8)  # no more processes than cores, at most a server
    clean_hpu_env.setattr(os, "sched_getaffinity", lambda pid: set(range(96)))
    hpu._backends.clear()
    assert HPUAccelerator.auto_device_count() == 8  # one Gaudi server
    clean_hpu_env.setenv(hpu.DEVICES_ENV, "2")
    assert HPUAccelerator.auto_device_count() == 2
    with pytest.raises(ValueError, match="asks for 3 HPUs but this node has 2"):
        Trainer(accelerator="hpu", devices=3)
    for bad in ("0", "two"):
        clean_hpu_env.setenv(hpu.DEVICES_ENV, bad)
        with pytest.raises(ValueError, match=f"{hpu.DEVICES_ENV}='{bad}' must be a positive integer"):
            HPUAccelerator.auto_device_count()
    clean_hpu_env.setenv(hpu.DEVICES_ENV, "8")
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI9")
    with pytest.raises(ValueError, match="not a Gaudi generation"):
        hpu.get_backend()


def test_accelerator_basics(eager_hpu: hpu.Backend) -> None:
    assert HPUAccelerator.name() == "hpu"
    assert HPUAccelerator.is_available()
    assert HPUAccelerator.get_parallel_devices(2) == [torch.device("cpu")] * 2
    assert eager_hpu.emulated
    assert eager_hpu.collective_backend == "hccl"
    assert not eager_hpu.is_lazy()


def test_trainer_device_errors_come_before_any_process(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(MisconfigurationException, match=r"devices=0"):
        Trainer(accelerator="hpu", devices=0)
    with pytest.raises(ValueError, match="asks for 9 HPUs but this node has 8"):
        Trainer(accelerator="hpu", devices=9, strategy="hpu_parallel")
    with pytest.raises(ValueError, match="out of range"):
        Trainer(accelerator="hpu", devices=[6, 8])


def test_unknown_emulation_mode(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "turbo")
    with pytest.raises(ValueError, match=r"LIGHTNING_GAUDI_EMULATE='turbo' is not an emulation mode.*'eager'.*'lazy'"):
        Trainer(accelerator="hpu", devices=1)
    with pytest.raises(ValueError, match="not an emulation mode"):
        HPUAccelerator.is_available()


@pytest.mark.parametrize("value", ["", "0", "off"])
def test_emulation_off_values(clean_hpu_env: pytest.MonkeyPatch, value: str) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, value)
    assert hpu.emulation_mode() is None


def test_no_bridge_no_emulation(no_hpu: None) -> None:
    assert not HPUAccelerator.is_available()
    with pytest.raises(hpu.HPUUnavailableError) as error:
        Trainer(accelerator="hpu", devices=1)
    message = str(error.value)
    assert "Intel Gaudi software" in message  # how to install
    assert "docs.habana.ai" in message
    assert f"{hpu.EMULATE_ENV}=eager" in message  # how to emulate
    # with nothing asked for, the Trainer's automatic choice stays Lightning's
    assert not isinstance(Trainer(devices=1, logger=False).accelerator, HPUAccelerator)


def test_auto_accelerator_picks_emulated_hpu(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(devices=1, logger=False)
    assert isinstance(trainer.accelerator, HPUAccelerator)
    assert isinstance(trainer.strategy, SingleHPUStrategy)


def test_device_stats_in_the_bridge_form(eager_hpu: hpu.Backend) -> None:
    stats = HPUAccelerator().get_device_stats(torch.device("cpu"))
    assert set(stats) == {
        f"hpu/{key} (GiB)" if key in MEMORY_BYTE_KEYS else f"hpu/{key}" for key in hpu.MEMORY_STAT_KEYS
    }
    assert 0 < stats["hpu/InUse (GiB)"] <= stats["hpu/MaxInUse (GiB)"] <= stats["hpu/Limit (GiB)"]
    assert stats["hpu/NumAllocs"] == 0, "emulation has no allocation counters"


@pytest.mark.parametrize("backend", ["eager_hpu", "lazy_hpu"])
def test_get_device_name_in_emulation(
    backend: str, request: pytest.FixtureRequest, clean_hpu_env: pytest.MonkeyPatch
) -> None:
    request.getfixturevalue(backend)
    assert HPUAccelerator.get_device_name() == "GAUDI2"
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI3")
    assert HPUAccelerator.get_device_name() == "GAUDI3"


def test_get_device_name_without_hpu(no_hpu: None) -> None:
    with pytest.raises(hpu.HPUUnavailableError, match="LIGHTNING_GAUDI_EMULATE=eager"):
        HPUAccelerator.get_device_name()


class _MetricsLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "capture"

    @property
    def version(self) -> int:
        return 0

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.append(metrics)

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass


def test_device_stats_monitor_logs_hpu_memory(eager_hpu: hpu.Backend) -> None:
    logger = _MetricsLogger()
    trainer = Trainer(
        accelerator="hpu",
        devices=1,
        callbacks=[DeviceStatsMonitor()],
        **trainer_kwargs(logger=logger, log_every_n_steps=1),
    )
    trainer.fit(RegressionModel())
    logged = {key for metrics in logger.metrics for key in metrics}
    assert any(key.startswith("DeviceStatsMonitor.on_train_batch_start/hpu/InUse (GiB)") for key in logged), logged


def test_accelerator_instance_with_auto_strategy(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator=HPUAccelerator(), devices=2, precision="bf16-mixed", logger=False)
    assert isinstance(trainer.strategy, HPUParallelStrategy)
    assert isinstance(trainer.precision_plugin, HPUPrecision)
