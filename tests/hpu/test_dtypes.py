"""float64 and int64 on a Gaudi, as Intel's bridge v1.19.0 holds them (:mod:`lightning_gaudi.hpu.dtypes`), and the
emulator changing or refusing the same values where the plugin moves data to the device."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch import Trainer

from lightning_gaudi import hpu
from lightning_gaudi.checkpoint_io import HPUCheckpointIO
from lightning_gaudi.hpu.dtypes import RANGE_CHECK_ENV, downcast_range_message, int64_supported
from lightning_gaudi.hpu.runtime import INT64_ENV

CLOSE_TO_ONE = 1.0 + 2.0**-30  # exact in float64, 1.0 in float32
ABOVE_INT32 = 2**31 + 5  # wraps to -2**31 + 5 in int32


@pytest.mark.parametrize(
    ("lazy", "name", "variable", "expected"),
    [
        (False, "GAUDI2", None, True),  # common/eager/utils.cpp:33: true by default in eager mode
        (False, "GAUDI3", None, True),
        (False, "GAUDI", None, False),  # utils.cpp:35-36: first-generation Gaudi
        (False, "GAUDI2", "0", False),  # utils.cpp:38-40: the variable, where set, decides
        (False, "GAUDI", "true", True),
        (False, "GAUDI2", "", True),  # empty is unset (env_flags.cpp:297)
        (True, "GAUDI2", None, False),  # common/lazy/utils.cpp:33-35: the flag, default false (env_flags.yaml:626)
        (True, "GAUDI2", "1", True),
    ],
)
def test_int64_support_follows_the_bridge(lazy: bool, name: str, variable: str | None, expected: bool) -> None:
    env = {} if variable is None else {INT64_ENV: variable}
    assert int64_supported(lazy, name, env) is expected


def test_a_malformed_int64_variable_is_refused_as_the_bridge_stops_on_it() -> None:
    with pytest.raises(ValueError, match=INT64_ENV):
        int64_supported(False, "GAUDI2", {INT64_ENV: "yes"})


@pytest.mark.parametrize("int64", [True, False])
def test_float64_is_held_in_float32_and_int64_in_int32_without_support(
    eager_hpu: hpu.Backend, clean_hpu_env: pytest.MonkeyPatch, int64: bool
) -> None:
    clean_hpu_env.setenv(INT64_ENV, "1" if int64 else "0")
    assert eager_hpu.device_dtype(torch.float64) == torch.float32  # create_tensor.cpp:1068, whatever the flag
    assert eager_hpu.device_dtype(torch.int64) == (torch.int64 if int64 else torch.int32)
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.uint8, torch.bool):
        assert eager_hpu.device_dtype(dtype) == dtype


def test_the_lazy_copy_refusal_in_the_bridge_words() -> None:
    assert downcast_range_message(torch.int64, torch.int32, 2**31, 2**31) == (
        "Error when trying to cast Long to Int, Input values range [2147483648, 2147483648] exceeds Int range"
        " [-2147483648, 2147483647]"
    )
    assert downcast_range_message(torch.float64, torch.float32, -1.0, 1e39) == (
        "Error when trying to cast Double to Float, Input values range [-1, 1e+39] exceeds Float range"
        " [-3.40282e+38, 3.40282e+38]"
    )


def test_eager_emulation_holds_float64_in_float32(eager_hpu: hpu.Backend) -> None:
    assert eager_hpu.device_dtype(torch.float64) == torch.float32
    held = eager_hpu.copied_to_device(torch.tensor([CLOSE_TO_ONE, 1e300], dtype=torch.float64))
    assert held.dtype == torch.float64  # the dtype is kept, the values are float32's (copy_from.cpp:382-383)
    assert held.tolist() == [1.0, float("inf")]  # eager mode casts without a range check


def test_eager_emulation_keeps_int64_on_gaudi2_and_wraps_it_on_gaudi(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    big = torch.tensor([ABOVE_INT32, -7])
    assert hpu.get_backend().copied_to_device(big).tolist() == [ABOVE_INT32, -7]
    clean_hpu_env.setenv(INT64_ENV, "0")
    assert hpu.get_backend().copied_to_device(big).tolist() == [-(2**31) + 5, -7]
    clean_hpu_env.delenv(INT64_ENV)
    clean_hpu_env.setenv(hpu.DEVICE_NAME_ENV, "GAUDI")
    backend = hpu.get_backend()
    assert not backend.int64_supported()
    held = backend.copied_to_device(big)
    assert held.dtype == torch.int64
    assert held.tolist() == [-(2**31) + 5, -7]


def test_lazy_emulation_refuses_what_the_lazy_copy_refuses(
    lazy_hpu: hpu.Backend, clean_hpu_env: pytest.MonkeyPatch
) -> None:
    assert not lazy_hpu.int64_supported()
    with pytest.raises(RuntimeError) as error:
        lazy_hpu.copied_to_device(torch.tensor([3, ABOVE_INT32]))
    assert str(error.value) == downcast_range_message(torch.int64, torch.int32, 3, ABOVE_INT32)
    with pytest.raises(RuntimeError, match=r"cast Double to Float, Input values range \[0, 1e\+300\]"):
        lazy_hpu.copied_to_device(torch.tensor([0.0, 1e300], dtype=torch.float64))
    # NaN counts as 0 and infinities as float32's extremes (lazy_kernels.cpp:276-277): they pass
    passed = lazy_hpu.copied_to_device(torch.tensor([float("nan"), float("inf"), CLOSE_TO_ONE], dtype=torch.float64))
    assert passed[1:].tolist() == [float("inf"), 1.0]
    assert passed[0].isnan()
    clean_hpu_env.setenv(RANGE_CHECK_ENV, "false")  # the check off: cast as eager mode casts
    assert lazy_hpu.copied_to_device(torch.tensor([ABOVE_INT32])).tolist() == [-(2**31) + 5]


def test_the_bridge_converts_at_its_own_copy(bridge_double: Any) -> None:
    backend = hpu.get_backend()
    assert backend.device_dtype(torch.float64) == torch.float32
    tensor = torch.tensor([CLOSE_TO_ONE], dtype=torch.float64)
    assert backend.copied_to_device(tensor) is tensor


def test_trainer_batches_reach_the_emulated_device_with_gaudi_values(eager_hpu: hpu.Backend) -> None:
    trainer = Trainer(accelerator="hpu", devices=1, logger=False, enable_checkpointing=False)
    batch = {"x": torch.tensor([CLOSE_TO_ONE], dtype=torch.float64), "ids": [torch.tensor([ABOVE_INT32])]}
    moved = trainer.strategy.batch_to_device(batch)
    assert moved["x"].dtype == torch.float64
    assert moved["x"].tolist() == [1.0]
    assert moved["ids"][0].tolist() == [ABOVE_INT32]  # GAUDI2 in eager mode keeps int64
    assert batch["x"].tolist() == [CLOSE_TO_ONE]  # the host batch itself is left alone


def test_double_precision_is_refused_saying_gaudi_holds_float64_in_float32(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"'64-true'.*cannot run on an HPU\. A Gaudi holds float64 tensors in float32"):
        Trainer(accelerator="hpu", devices=1, precision="64-true")


def test_checkpoints_keep_float64_and_int64_dtypes(tmp_path: Any) -> None:
    # a Gaudi hands float64 and int64 back in their own dtype (copy_from.cpp:213-219): the checkpoint is host tensors
    state = {"f": torch.tensor([CLOSE_TO_ONE], dtype=torch.float64), "i": torch.tensor([ABOVE_INT32])}
    io = HPUCheckpointIO()
    io.save_checkpoint(state, tmp_path / "c.ckpt")
    loaded = io.load_checkpoint(tmp_path / "c.ckpt")
    assert loaded["f"].dtype == torch.float64
    assert loaded["f"].tolist() == [CLOSE_TO_ONE]
    assert loaded["i"].dtype == torch.int64
    assert loaded["i"].tolist() == [ABOVE_INT32]
