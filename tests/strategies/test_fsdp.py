"""``hpu_fsdp`` in one process: names, arguments, precision, bad input, sharded checkpoint writes, the bridge path."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.environments.lightning import find_free_network_port
from lightning.pytorch import Trainer
from lightning_utilities.core.imports import RequirementCache
from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
from torch.distributed.fsdp.wrap import ModuleWrapPolicy

from lightning_gaudi import (
    HPUAccelerator,
    HPUCheckpointIO,
    HPUFSDPPrecision,
    HPUFSDPStrategy,
    HPUPrecision,
    hpu,
)
from lightning_gaudi.strategies import fsdp


def _trainer(**kwargs: Any) -> Trainer:
    kwargs.setdefault("accelerator", "hpu")
    kwargs.setdefault("devices", 2)
    return Trainer(logger=False, enable_checkpointing=False, **kwargs)


def test_the_name_builds_the_strategy(eager_hpu: hpu.Backend) -> None:
    strategy = _trainer(strategy="hpu_fsdp").strategy
    assert type(strategy) is HPUFSDPStrategy
    assert isinstance(strategy.checkpoint_io, HPUCheckpointIO)
    assert strategy._get_process_group_backend() == "hccl"
    assert strategy.root_device == torch.device("cpu")
    assert strategy.fsdp_device == torch.device("cpu")  # torch's FSDP refuses a device_id of None on the CPU
    assert strategy.sharding_strategy is ShardingStrategy.FULL_SHARD
    assert strategy.state_dict_type == "full"
    assert _trainer(strategy="hpu_fsdp_sharded_checkpoint").strategy.state_dict_type == "sharded"


def test_lightnings_fsdp_name_runs_the_hpu_strategy(eager_hpu: hpu.Backend, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level("INFO"):
        strategy = _trainer(strategy="fsdp").strategy
    assert type(strategy) is HPUFSDPStrategy
    assert "`strategy='fsdp'` with accelerator='hpu': training with HPUFSDPStrategy()" in caplog.text
    with pytest.raises(ValueError, match="requires a GPU accelerator"):  # other accelerators: Lightning's own choice
        Trainer(accelerator="cpu", strategy="fsdp", devices=2, logger=False)


def test_lightnings_cpu_offload_name_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"cpu_offload=True.*not offered on HPUs.*Remove it"):
        _trainer(strategy="fsdp_cpu_offload")


@pytest.mark.parametrize("strategy", ["hpu_fsdp", "hpu_fsdp_sharded_checkpoint"])
def test_another_accelerator_is_refused(eager_hpu: hpu.Backend, strategy: str) -> None:
    with pytest.raises(ValueError, match=r"runs on HPUs, but the accelerator is CPUAccelerator.*accelerator='hpu'"):
        Trainer(accelerator="cpu", strategy=strategy, devices=2)


def test_an_unknown_sharding_strategy_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`sharding_strategy='FULL_SHRAD'` is not.*Did you mean 'FULL_SHARD'"):
        HPUFSDPStrategy(sharding_strategy="FULL_SHRAD")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"`sharding_strategy='ZERO3'` is not a sharding strategy; use one of"):
        HPUFSDPStrategy(sharding_strategy="ZERO3")  # type: ignore[arg-type]
    assert HPUFSDPStrategy(sharding_strategy="shard_grad_op").sharding_strategy is ShardingStrategy.SHARD_GRAD_OP  # type: ignore[arg-type]
    assert HPUFSDPStrategy(sharding_strategy=ShardingStrategy.NO_SHARD).sharding_strategy is ShardingStrategy.NO_SHARD


def test_bad_arguments_are_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`state_dict_type='distributed'` must be 'full'.*or 'sharded'"):
        HPUFSDPStrategy(state_dict_type="distributed")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'limit_all_gather'.*'limit_all_gathers'"):
        HPUFSDPStrategy(limit_all_gather=True)
    with pytest.raises(TypeError, match="`device_id` is set by HPUFSDPStrategy itself"):
        HPUFSDPStrategy(device_id=0)
    with pytest.raises(ValueError, match=r"`auto_wrap_policy` names 'torch.nn.NoSuchLayer', which cannot be imported"):
        HPUFSDPStrategy(auto_wrap_policy=["torch.nn.NoSuchLayer"])
    with pytest.raises(ValueError, match=r"`activation_checkpointing_policy` must hold torch.nn.Module classes"):
        HPUFSDPStrategy(activation_checkpointing_policy=["torch.optim.SGD"])
    with pytest.raises(ValueError, match="`timeout"):
        HPUFSDPStrategy(timeout=-1)


def test_wrap_policies_take_classes_or_their_dotted_paths(eager_hpu: hpu.Backend) -> None:
    strategy = HPUFSDPStrategy(
        auto_wrap_policy=["torch.nn.Linear"], activation_checkpointing_policy={torch.nn.TransformerEncoderLayer}
    )
    policy = strategy.kwargs["auto_wrap_policy"]
    assert isinstance(policy, ModuleWrapPolicy)
    assert policy._module_classes == {torch.nn.Linear}


@pytest.mark.parametrize(
    ("precision", "param_dtype", "autocast"),
    [("bf16-mixed", torch.bfloat16, True), ("32-true", torch.float32, False), ("bf16-true", torch.bfloat16, False)],
)
def test_precision_autocasts_on_the_hpu_device_type(
    eager_hpu: hpu.Backend, precision: str, param_dtype: torch.dtype, autocast: bool
) -> None:
    if precision == "bf16-mixed" and not RequirementCache("lightning>=2.6"):
        pytest.skip("Lightning 2.5's FSDP bf16-mixed keeps float32 parameters (2.6: bfloat16); the plugin follows it")
    trainer = _trainer(strategy="hpu_fsdp", precision=precision)
    plugin = trainer.precision_plugin
    assert type(plugin) is HPUFSDPPrecision
    assert trainer.strategy.precision_plugin is plugin
    assert plugin.autocast_device == "cpu"
    config = trainer.strategy.mixed_precision_config
    assert isinstance(config, MixedPrecision)
    assert config.param_dtype == param_dtype
    with plugin.forward_context():
        assert torch.is_autocast_enabled("cpu") is autocast
        assert not torch.is_autocast_enabled("cuda")  # Lightning's own plugin autocasts on CUDA whatever the device
        if autocast:
            assert torch.get_autocast_dtype("cpu") == torch.bfloat16


def test_16_mixed_scales_on_the_hpu(eager_hpu: hpu.Backend) -> None:
    plugin = _trainer(strategy="hpu_fsdp", precision="16-mixed").precision_plugin
    assert isinstance(plugin, HPUFSDPPrecision)
    assert plugin.scaler is not None
    assert plugin.scaler._device == "cpu"


def test_other_precisions_are_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"`precision='fp8'` does not run with strategy 'hpu_fsdp'"):
        HPUFSDPStrategy().hpu_precision_plugin("fp8")
    with pytest.raises(TypeError, match=r"HPUFSDPPrecision plugin.*got HPUPrecision.*precision='bf16-mixed'"):
        _trainer(strategy="hpu_fsdp", plugins=[HPUPrecision("bf16-mixed")])
    with pytest.raises(ValueError, match=r"64-true"):
        _trainer(strategy="hpu_fsdp", precision="64-true")


def test_lazy_emulation_is_refused(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"'hpu_fsdp' cannot run in lazy mode: Intel supports FSDP on Gaudi in eager"):
        Trainer(accelerator="hpu", strategy="hpu_fsdp", devices=1, logger=False)


def _sharded_strategy() -> HPUFSDPStrategy:
    return HPUFSDPStrategy(state_dict_type="sharded")  # no process group: one rank, collectives pass through


def _read(path: Path) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    state = {"model": {"w": torch.zeros(3)}}
    dcp.load(state, checkpoint_id=path)
    return {"w": state["model"]["w"], **torch.load(path / fsdp.METADATA_FILENAME, weights_only=False)}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's single-process warning for distributed checkpoints
def test_a_sharded_checkpoint_is_renamed_into_place_complete(
    eager_hpu: hpu.Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "epoch=0.ckpt"
    target.write_bytes(b"an earlier full checkpoint")
    strategy = _sharded_strategy()
    strategy.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "optimizer_states": [], "epoch": 1}, target)
    assert target.is_dir()
    saved = _read(target)
    assert saved["epoch"] == 1
    torch.testing.assert_close(saved["w"], torch.ones(3))
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no staging or old copy left

    def crash(state: Any, checkpoint_id: Path) -> None:
        (checkpoint_id / "__0_0.distcp").write_bytes(b"half a shard")
        raise OSError("disk full")

    monkeypatch.setattr("torch.distributed.checkpoint.save", crash)
    with pytest.raises(OSError, match="disk full"):
        strategy.save_checkpoint({"state_dict": {"w": torch.full((3,), 2.0)}, "epoch": 2}, target)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]
    saved = _read(target)  # the previous checkpoint, untouched
    assert saved["epoch"] == 1
    torch.testing.assert_close(saved["w"], torch.ones(3))


def test_a_sharded_checkpoint_to_a_url_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"sharded checkpoints to local paths only.*'s3://bucket/x.ckpt'"):
        _sharded_strategy().save_checkpoint({"state_dict": {}}, "s3://bucket/x.ckpt")


# ---------------------------------------------------------------------------------------------------------------------
# The real-bridge path, through the double of Intel's habana_frameworks
# ---------------------------------------------------------------------------------------------------------------------


def test_bridge_path_uses_the_hpu_device_and_hccl(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    trainer = _trainer(strategy="hpu_fsdp", precision="bf16-mixed")
    strategy = trainer.strategy
    assert isinstance(strategy, HPUFSDPStrategy)
    assert strategy.root_device == torch.device("hpu")
    assert strategy.fsdp_device == torch.device("hpu", 0)  # torch's FSDP takes no index-less accelerator device
    assert strategy._get_process_group_backend() == "hccl"
    assert isinstance(trainer.precision_plugin, HPUFSDPPrecision)
    assert trainer.precision_plugin.autocast_device == "hpu"


def test_bridge_path_in_lazy_mode_is_refused(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    with pytest.raises(ValueError, match=r"'hpu_fsdp' cannot run in lazy mode: Intel supports FSDP on Gaudi in eager"):
        _trainer(strategy="hpu_fsdp")


class _Wrapped(Exception):
    pass


class _RecordingFSDP:
    """Records what the strategy wraps the model with, then stops (tensors cannot move to the double's "hpu")."""

    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, module: torch.nn.Module, **kwargs: Any) -> None:
        type(self).seen.update(module=module, **kwargs)
        raise _Wrapped


def test_bridge_path_wraps_on_the_hpu_over_hccl(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(find_free_network_port()))
    for name in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        monkeypatch.delenv(name, raising=False)
    strategy = HPUFSDPStrategy(
        accelerator=HPUAccelerator(),
        parallel_devices=HPUAccelerator.get_parallel_devices(1),
        cluster_environment=LightningEnvironment(),
        sharding_strategy="SHARD_GRAD_OP",
        auto_wrap_policy={torch.nn.Linear},
        limit_all_gathers=True,
    )
    monkeypatch.setattr(fsdp, "FullyShardedDataParallel", _RecordingFSDP)
    try:
        strategy.setup_environment()
        assert dist.get_backend() == "hccl"
        assert bridge_double.called("hccl.initialize_distributed_hpu")[0].kwargs == {
            "world_size": 1,
            "rank": 0,
            "local_rank": 0,
        }
        model = torch.nn.Sequential(torch.nn.Linear(2, 2))
        with pytest.raises(_Wrapped):
            strategy._setup_model(model)
        seen = _RecordingFSDP.seen
        assert seen["module"] is model
        assert seen["device_id"] == torch.device("hpu", 0)
        assert seen["sharding_strategy"] is ShardingStrategy.SHARD_GRAD_OP
        assert seen["limit_all_gathers"] is True
        assert isinstance(seen["auto_wrap_policy"], ModuleWrapPolicy)
        assert "auto_wrap_policy" in strategy.kwargs  # kept for the next stage's wrapping
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class _OneRank:
    """What ``save_staged`` reads of a strategy, for one process."""

    is_global_zero = True
    timeout = timedelta(seconds=30)

    @staticmethod
    def broadcast(obj: Any, src: int = 0) -> Any:
        return obj

    @staticmethod
    def barrier(name: str | None = None) -> None:
        return None


@pytest.mark.subprocess
def test_a_killed_sharded_saves_staging_folder_is_removed_by_the_next_save(tmp_path: Path) -> None:
    """A staging folder whose writer is gone (a save killed half-way) is removed as the checkpoint IO removes its
    file temporaries; one a live process is writing stays."""
    import subprocess
    import sys

    from lightning_gaudi import checkpoint_io
    from lightning_gaudi.strategies._staged import save_staged

    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True).stdout)
    killed = tmp_path / checkpoint_io.temporary_name("step=10.ckpt", checkpoint_io._writer_id(), gone)
    (killed / "sub").mkdir(parents=True)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as sleeper:
        alive = tmp_path / checkpoint_io.temporary_name("step=10.ckpt", checkpoint_io._writer_id(), sleeper.pid)
        alive.mkdir()
        save_staged(_OneRank(), tmp_path / "step=20.ckpt", lambda staging: (staging / "shard").write_text("x"))
        sleeper.kill()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, "step=20.ckpt"])
    assert (tmp_path / "step=20.ckpt" / "shard").read_text() == "x"


def test_a_peer_lost_during_a_sharded_save_is_a_peer_lost_error_and_leaves_nothing(tmp_path: Path) -> None:
    """A rank dying while the others write their shards (DeepSpeed's and torch's checkpoint collectives fail with
    gloo's words) is a PeerLostError naming the save, and the staging folder goes."""
    from lightning_gaudi.distributed import PeerLostError
    from lightning_gaudi.strategies._staged import save_staged

    def write(staging: Path) -> None:
        (staging / "shard").write_text("x")
        raise RuntimeError("[/gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:29500")

    with pytest.raises(PeerLostError, match="sharded checkpoint save"):
        save_staged(_OneRank(), tmp_path / "step=20.ckpt", write)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch's single-process warnings, Lightning's mid-epoch resume
def test_a_sharded_checkpoint_of_a_stateless_optimizer_resumes(eager_hpu: hpu.Backend, tmp_path: Path) -> None:
    """SGD without momentum has no per-parameter state: its sharded checkpoint resumes (torch distributed checkpoint
    keeps no empty ``state``, which torch's FSDP loading requires), with its learning rate restored."""
    from helpers.models import RegressionModel, trainer_kwargs

    def fit(model: RegressionModel, steps: int, ckpt_path: Path | None = None) -> Trainer:
        trainer = Trainer(
            accelerator="hpu",
            devices=1,
            strategy=HPUFSDPStrategy(state_dict_type="sharded"),
            **trainer_kwargs(max_steps=steps),
        )
        trainer.fit(model, ckpt_path=ckpt_path)
        return trainer

    checkpoint = tmp_path / "sharded.ckpt"
    try:
        fit(RegressionModel(lr=0.1), 2).save_checkpoint(checkpoint)
        assert checkpoint.is_dir()
        resumed = fit(RegressionModel(lr=0.5), 3, checkpoint)
    finally:
        if dist.is_initialized():  # the one-rank group the fits formed
            dist.destroy_process_group()
    assert resumed.global_step == 3
    assert resumed.optimizers[0].param_groups[0]["lr"] == 0.1  # the checkpoint's, not the new model's
