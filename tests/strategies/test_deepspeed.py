"""``hpu_deepspeed`` without starting processes: names, bad input refused before anything starts, DeepSpeed's
accelerator choice, gradient clipping from the Trainer, and the real (bridge) path's set-up calls."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.models import RegressionModel, make_net, regression_data, regression_loader, trainer_kwargs
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.plugins.precision import DeepSpeedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUAccelerator, HPUDeepSpeedStrategy, HPUPrecision, hpu
from lightning_gaudi.distributed import rendezvous
from lightning_gaudi.hpu import deepspeed_accelerator
from lightning_gaudi.hpu.deepspeed_accelerator import DeepSpeedMissingError, deepspeed_accelerator_name
from lightning_gaudi.patches import deepspeed_strategy
from lightning_gaudi.strategies import deepspeed as ds_module
from lightning_gaudi.strategies.deepspeed import gradient_clipping

NAMES = ("hpu_deepspeed", "hpu_deepspeed_stage_1", "hpu_deepspeed_stage_2", "hpu_deepspeed_stage_3")
needs_deepspeed = pytest.mark.skipif(
    not RequirementCache("deepspeed"), reason="DeepSpeed is not installed (scripts/setup.sh installs it)"
)


def test_names_are_registered_without_deepspeed_too() -> None:
    for name in NAMES:
        assert StrategyRegistry[name]["strategy"] is HPUDeepSpeedStrategy
    assert StrategyRegistry["hpu_deepspeed"]["init_params"] == {}
    for stage in (1, 2, 3):
        assert StrategyRegistry[f"hpu_deepspeed_stage_{stage}"]["init_params"] == {"stage": stage}
    assert HPUDeepSpeedStrategy.lightning_counterparts == (DeepSpeedStrategy,)


@pytest.fixture
def ds_cpu(eager_hpu: hpu.Backend, clean_hpu_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Eager emulation with DeepSpeed's CPU accelerator (``DS_ACCELERATOR`` restored afterwards)."""
    if not RequirementCache("deepspeed"):
        pytest.skip("DeepSpeed is not installed (scripts/setup.sh installs it)")
    clean_hpu_env.setenv(deepspeed_accelerator.DS_ACCELERATOR_ENV, "cpu")
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "cpu"
    return clean_hpu_env


@pytest.mark.parametrize("stage", [4, -1, True, "2"])
def test_a_stage_deepspeed_lacks_is_refused_first(eager_hpu: hpu.Backend, stage: Any) -> None:
    with pytest.raises(ValueError, match=rf"`stage`={stage!r} is not a ZeRO stage.*0 \(off\), 1 .* 3"):
        HPUDeepSpeedStrategy(stage=stage)


@needs_deepspeed
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"zero_optimization": {"stage": 4}}, r"`zero_optimization.stage`=4 is not a ZeRO stage"),
        ({"zero_optimization": {"stage": 2, "overlap_comms": True}}, r"overlap_comms\n.*Extra inputs"),
        ({"zero_optimization": "2"}, "must be a mapping"),
        ({"gradient_accumulation_steps": 2}, r"accumulate_grad_batches"),
    ],
)
def test_a_bad_config_is_refused_when_the_strategy_is_built(
    ds_cpu: pytest.MonkeyPatch, config: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        HPUDeepSpeedStrategy(config=config)


@needs_deepspeed
def test_config_from_a_json_file_a_mapping_or_lightnings_variable(ds_cpu: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = {"zero_optimization": {"stage": 3}, "zero_allow_untested_optimizer": True}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(config))
    assert HPUDeepSpeedStrategy(config=str(path)).config == config
    assert HPUDeepSpeedStrategy(config=path).zero_stage_3
    given = {"zero_optimization": {"stage": 1}}
    strategy = HPUDeepSpeedStrategy(config=given)
    assert strategy.config == given
    assert strategy.config is not given  # the strategy fills it in; the caller's dict stays as it was
    ds_cpu.setenv(DeepSpeedStrategy.DEEPSPEED_ENV_VAR, str(path))
    assert HPUDeepSpeedStrategy().config == config


@needs_deepspeed
def test_a_bad_config_file_is_named(ds_cpu: pytest.MonkeyPatch, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope.json' does not exist"):
        HPUDeepSpeedStrategy(config=tmp_path / "nope.json")
    broken = tmp_path / "broken.json"
    broken.write_text('{"zero_optimization": ')
    with pytest.raises(ValueError, match=r"broken.json' is not valid JSON: .*line 1"):
        HPUDeepSpeedStrategy(config=broken)
    listed = tmp_path / "list.json"
    listed.write_text("[1]")
    with pytest.raises(ValueError, match=r"holds a list, not a JSON object"):
        HPUDeepSpeedStrategy(config=listed)


@needs_deepspeed
def test_a_hydra_node_becomes_a_plain_config(ds_cpu: pytest.MonkeyPatch) -> None:
    from omegaconf import OmegaConf

    node = OmegaConf.create({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}, "steps": [1, 2]})
    strategy = HPUDeepSpeedStrategy(config=node)
    assert strategy.config == {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000}, "steps": [1, 2]}
    assert type(strategy.config["zero_optimization"]) is dict
    assert type(strategy.config["steps"]) is list


def test_missing_deepspeed_names_the_install(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ds_module, "DEEPSPEED_AVAILABLE", RequirementCache("deepspeed-not-installed-here"))
    with pytest.raises(ImportError, match=r"needs DeepSpeed, which is not installed.*lightning-gaudi\[deepspeed\]"):
        HPUDeepSpeedStrategy()


def test_an_unimportable_deepspeed_names_the_install(clean_hpu_env: pytest.MonkeyPatch) -> None:
    """DeepSpeed's metadata present but the package not importable (a broken install): the same error."""
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    for name in ("deepspeed", "deepspeed.accelerator"):
        clean_hpu_env.setitem(sys.modules, name, None)
    clean_hpu_env.setenv(deepspeed_accelerator.DS_ACCELERATOR_ENV, "cpu")
    with pytest.raises(DeepSpeedMissingError, match=r"needs DeepSpeed, which is not installed"):
        deepspeed_accelerator.select_deepspeed_accelerator(hpu.get_backend(), "X")


def test_on_gaudi_missing_deepspeed_names_intels_fork(bridge_double: ModuleType) -> None:
    message = deepspeed_accelerator.missing_deepspeed_message(hpu.get_backend(), "HPUDeepSpeedStrategy")
    assert "Intel's DeepSpeed fork" in message
    assert "pip install git+https://github.com/HabanaAI/DeepSpeed.git@" in message
    assert deepspeed_accelerator.is_intel_fork("0.16.1+hpu.synapse.v1.22.0")
    assert not deepspeed_accelerator.is_intel_fork("0.19.8")


@needs_deepspeed
def test_an_accelerator_that_is_no_hpu_is_refused(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(
        ValueError, match=r"'hpu_deepspeed' strategy runs on HPUs, but the accelerator is CPUAccelerator"
    ):
        HPUDeepSpeedStrategy(accelerator=CPUAccelerator())


@needs_deepspeed
def test_the_trainer_refuses_another_accelerator(ds_cpu: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"runs on HPUs, but the accelerator is CPUAccelerator"):
        Trainer(accelerator="cpu", strategy="hpu_deepspeed", devices=2, logger=False)


@needs_deepspeed
def test_lazy_emulation_is_refused(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"DeepSpeed cannot run under lazy emulation.*LIGHTNING_GAUDI_EMULATE=eager"):
        HPUDeepSpeedStrategy()


@needs_deepspeed
def test_another_ds_accelerator_in_the_environment_is_refused(clean_hpu_env: pytest.MonkeyPatch) -> None:
    clean_hpu_env.setenv(hpu.EMULATE_ENV, "eager")
    clean_hpu_env.setenv(deepspeed_accelerator.DS_ACCELERATOR_ENV, "cuda")
    with pytest.raises(ValueError, match=r"DS_ACCELERATOR='cuda', but HPUDeepSpeedStrategy on the emulated HPU needs"):
        HPUDeepSpeedStrategy()


@needs_deepspeed
def test_deepspeed_imported_with_another_accelerator_is_refused(ds_cpu: pytest.MonkeyPatch) -> None:
    import deepspeed.accelerator

    ds_cpu.setattr(deepspeed.accelerator, "get_accelerator", lambda: SimpleNamespace(device_name=lambda: "cuda"))
    with pytest.raises(RuntimeError, match=r"imported before lightning_gaudi could choose, uses its 'cuda'"):
        HPUDeepSpeedStrategy()


@pytest.mark.double_only("stands in for DeepSpeed's HPU accelerator (which the double lacks)")
@needs_deepspeed
def test_the_bridge_wants_deepspeeds_hpu_accelerator(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the real path DeepSpeed must use its "hpu" accelerator: this process's DeepSpeed, already set up for the
    CPU, is refused rather than silently training on the host."""
    from deepspeed.accelerator import get_accelerator

    assert get_accelerator().device_name() == "cpu"  # imported for the emulated tests before
    assert deepspeed_accelerator_name(hpu.get_backend()) == "hpu"
    monkeypatch.setenv(deepspeed_accelerator.DS_ACCELERATOR_ENV, "")  # so that monkeypatch restores what was there
    monkeypatch.delenv(deepspeed_accelerator.DS_ACCELERATOR_ENV)
    with pytest.raises(RuntimeError, match=r"uses its 'cpu' accelerator, but HPUDeepSpeedStrategy needs 'hpu'"):
        HPUDeepSpeedStrategy()
    assert deepspeed_accelerator.os.environ[deepspeed_accelerator.DS_ACCELERATOR_ENV] == "hpu"


@pytest.mark.double_only("stands in for DeepSpeed's HPU accelerator (which the double lacks)")
@needs_deepspeed
def test_real_path_setup_uses_the_hpu_and_hccl(bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """With DeepSpeed's HPU accelerator chosen (stood in for: the double lacks what DeepSpeed's HPU accelerator
    imports), the strategy forms an HCCL group on the HPU after ``initialize_distributed_hpu``; DeepSpeed adopts it."""
    import deepspeed

    chosen: list[tuple[str, str]] = []

    def select(backend: hpu.Backend, what: str) -> str:
        chosen.append((deepspeed_accelerator_name(backend), what))
        return "hpu"

    monkeypatch.setattr(ds_module, "select_deepspeed_accelerator", select)
    monkeypatch.setattr(ds_module, "is_intel_fork", lambda version: True)
    for name, value in {
        "LOCAL_RANK": "1",
        "NODE_RANK": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29514",
    }.items():
        monkeypatch.setenv(name, value)
    for name in ("RANK", "WORLD_SIZE"):
        monkeypatch.setenv(name, "")  # the strategy sets them; monkeypatch restores them
        monkeypatch.delenv(name)  # unset: the bridge's import reads them as integers (distributed/hccl/__init__.py:85)
    groups: list[dict[str, Any]] = []

    def init_process_group(backend: str, **kwargs: Any) -> None:
        bridge_double.record("dist.init_process_group", backend, **kwargs)
        groups.append({"backend": backend, **kwargs})

    def init_distributed(dist_backend: str, **kwargs: Any) -> None:
        bridge_double.record("deepspeed.init_distributed", dist_backend, **kwargs)

    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", init_process_group)
    # no rank 0 runs here: the check that a store answers on MASTER_PORT would wait out the timeout
    monkeypatch.setattr(rendezvous, "probe_store", lambda *args, **kwargs: None)
    monkeypatch.setattr(dist, "get_world_size", lambda group=None: groups[-1]["world_size"])
    monkeypatch.setattr(deepspeed, "init_distributed", init_distributed)
    strategy = HPUDeepSpeedStrategy(
        accelerator=HPUAccelerator(),
        parallel_devices=[torch.device("hpu")] * 2,
        cluster_environment=LightningEnvironment(),
        timeout=30,
    )
    strategy._num_nodes = 2
    strategy.setup_distributed()

    assert chosen == [("hpu", "HPUDeepSpeedStrategy")]
    assert strategy.root_device == torch.device("hpu")
    assert bridge_double.called("hccl.initialize_distributed_hpu")[0].kwargs == {
        "world_size": 4,
        "rank": 3,
        "local_rank": 1,
    }
    names = bridge_double.names()
    assert names.index("hccl.initialize_distributed_hpu") < names.index("dist.init_process_group")
    assert names.index("dist.init_process_group") < names.index("deepspeed.init_distributed")
    assert groups == [{"backend": "hccl", "rank": 3, "world_size": 4, "timeout": timedelta(seconds=30)}]
    adopted = bridge_double.called("deepspeed.init_distributed")[0]
    assert adopted.args == ("hccl",)
    assert adopted.kwargs == {"auto_mpi_discovery": False, "timeout": timedelta(seconds=30)}
    assert (sys.modules["os"].environ["RANK"], sys.modules["os"].environ["WORLD_SIZE"]) == ("3", "4")


@needs_deepspeed
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_precision_is_deepspeeds(ds_cpu: pytest.MonkeyPatch, precision: str) -> None:
    trainer = Trainer(accelerator="hpu", strategy="hpu_deepspeed", devices=2, precision=precision, logger=False)
    assert type(trainer.precision_plugin) is DeepSpeedPrecision
    assert trainer.precision_plugin.precision == precision


@needs_deepspeed
def test_a_precision_plugin_deepspeed_cannot_use_is_refused(ds_cpu: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"needs Lightning's DeepSpeedPrecision, not HPUPrecision.*Trainer\(precision"):
        HPUDeepSpeedStrategy(precision_plugin=HPUPrecision("bf16-mixed"))


@needs_deepspeed
@pytest.mark.parametrize(
    ("name", "stage"), [("deepspeed", 2), ("deepspeed_stage_1", 1), ("deepspeed_stage_2", 2), ("deepspeed_stage_3", 3)]
)
def test_lightnings_names_run_the_hpu_strategy(ds_cpu: pytest.MonkeyPatch, name: str, stage: int) -> None:
    trainer = Trainer(accelerator="hpu", strategy=name, devices=2, logger=False)
    assert type(trainer.strategy) is HPUDeepSpeedStrategy
    assert trainer.strategy.config["zero_optimization"]["stage"] == stage


@needs_deepspeed
def test_lightnings_strategy_instance_runs_on_the_hpu_strategy(ds_cpu: pytest.MonkeyPatch) -> None:
    strategy = Trainer(accelerator="hpu", strategy=DeepSpeedStrategy(stage=1), devices=2, logger=False).strategy
    assert type(strategy) is HPUDeepSpeedStrategy
    assert strategy.config["zero_optimization"]["stage"] == 1


@pytest.mark.parametrize(
    ("config", "clip_val", "expected"),
    [({}, None, 0.0), ({}, 0.5, 0.5), ({"gradient_clipping": 0.0}, None, 0.0), ({"gradient_clipping": 2}, 2.0, 2.0)],
)
def test_gradient_clipping_is_the_trainers(config: dict[str, Any], clip_val: float | None, expected: float) -> None:
    assert gradient_clipping(config, clip_val, "norm") == expected


def test_a_config_clipping_other_than_the_trainer_is_refused() -> None:
    """DeepSpeed's default of 1.0 (or a config copied from its examples) never applies silently."""
    with pytest.raises(ValueError, match=r"gradient_clipping=1.0, but the Trainer has no gradient_clip_val.*=1.0\)"):
        gradient_clipping({"gradient_clipping": 1.0}, None, "norm")
    with pytest.raises(ValueError, match=r"gradient_clipping=1.0, but the Trainer has gradient_clip_val=0.5"):
        gradient_clipping({"gradient_clipping": 1.0}, 0.5, "norm")
    with pytest.raises(ValueError, match=r"clips gradients by norm only.*gradient_clip_algorithm='norm'"):
        gradient_clipping({}, 0.5, "value")


def test_unknown_keyword_is_refused_with_a_suggestion(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'offload_optimiser'.*'offload_optimizer'"):
        HPUDeepSpeedStrategy(offload_optimiser=True)


def _no_decay_grouped(
    params: list[torch.nn.Parameter],
) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LRScheduler]:
    """Hugging Face's grouping on a model without biases (its no-decay group empty), and a schedule per step."""
    optimizer = torch.optim.AdamW([{"params": params, "weight_decay": 0.1}, {"params": [], "weight_decay": 0.0}])
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (step + 1))


class _NoDecayGrouped(RegressionModel):
    def configure_optimizers(self) -> dict[str, Any]:  # type: ignore[override]
        optimizer, scheduler = _no_decay_grouped(list(self.parameters()))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def test_a_chained_scheduler_over_an_empty_group_is_refused_with_the_fix() -> None:
    from lightning_gaudi.strategies.deepspeed import _drop_empty_groups

    optimizer, scheduler = _no_decay_grouped([torch.nn.Parameter(torch.ones(2))])
    chained = torch.optim.lr_scheduler.ChainedScheduler([scheduler])
    with pytest.raises(ValueError, match=r"1 empty param group.*Leave the empty groups out"):
        _drop_empty_groups(optimizer, chained)
    _drop_empty_groups(optimizer, scheduler)
    assert (len(optimizer.param_groups), len(scheduler.base_lrs), len(scheduler.lr_lambdas)) == (1, 1, 1)
    optimizer.step()
    scheduler.step()


@pytest.fixture
def ds_fit(isolated_env: pytest.MonkeyPatch, ds_cpu: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """``ds_cpu`` for a 1-process fit in this process: the process group and DeepSpeed's copy of it ended after."""
    yield ds_cpu
    from deepspeed.utils import groups

    if dist.is_initialized():
        dist.destroy_process_group()
    groups._WORLD_GROUP = None


@needs_deepspeed
@pytest.mark.filterwarnings("error:Detected call of `lr_scheduler.step")  # the scheduler sees the optimizer step
@pytest.mark.parametrize("strategy", ["hpu_deepspeed", "hpu_deepspeed_stage_3"])
def test_an_empty_param_group_with_a_step_scheduler_trains_as_without_deepspeed(
    ds_fit: pytest.MonkeyPatch, tmp_path: Path, strategy: str
) -> None:
    """DeepSpeed drops the empty group; the scheduler, built with both, steps (it failed with "zip() argument 2 is
    longer than argument 1") and trains to the weights and rates ``hpu_parallel`` reaches (on one card: AdamW),
    which ``LearningRateMonitor`` logs for the one group DeepSpeed trains."""
    import deepspeed

    seed_everything(0, verbose=False)
    model = _NoDecayGrouped()
    reference = make_net()
    reference.load_state_dict(model.net.state_dict())
    monitor = LearningRateMonitor()
    kwargs = trainer_kwargs(max_steps=3, logger=CSVLogger(tmp_path), log_every_n_steps=1, callbacks=[monitor])
    trainer = Trainer(accelerator="hpu", strategy=strategy, devices=1, use_distributed_sampler=False, **kwargs)
    trainer.fit(model, regression_loader())
    optimizer, scheduler = _no_decay_grouped(list(reference.parameters()))
    x, y = regression_data(32)
    for step in range(3):
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(reference(x[4 * step : 4 * step + 4]), y[4 * step : 4 * step + 4]).backward()
        optimizer.step()
        scheduler.step()
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == scheduler.get_last_lr()[:1]
    assert trainer.optimizers[0].param_groups[0]["lr"] == scheduler.get_last_lr()[0]
    assert monitor.lrs == {"lr-AdamW": [1e-3, 5e-4, 1e-3 / 3]}
    params = list(model.net.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=strategy.endswith("3")):
        for name, tensor in reference.state_dict().items():
            torch.testing.assert_close(model.net.state_dict()[name], tensor, rtol=1e-5, atol=1e-6)


@needs_deepspeed
def test_a_stale_op_build_lock_fails_within_the_timeout_and_is_named(
    ds_fit: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job killed while torch built (or loaded) DeepSpeed's communication op leaves ``<TORCH_EXTENSIONS_DIR>/
    deepspeed_shm_comm/lock``; the next job's set-up waited on it forever, now for the strategy's timeout."""
    from deepspeed.comm import comm
    from deepspeed.ops.op_builder.builder import OpBuilder

    if not deepspeed_strategy.waits_on_a_lock_file():
        pytest.skip("this torch's build lock ends with its process: a file left behind blocks nothing")
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    ds_fit.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    # as in a new process: no DeepSpeed communication backend yet, the op not loaded
    ds_fit.setattr(comm, "cdb", None)
    ds_fit.delitem(OpBuilder._loaded_ops, "deepspeed_shm_comm", raising=False)
    strategy = HPUDeepSpeedStrategy(
        accelerator=HPUAccelerator(),
        parallel_devices=[torch.device("cpu")],
        cluster_environment=LightningEnvironment(),
        timeout=1,
    )
    start = time.monotonic()
    named = re.escape(str(lock))
    with pytest.raises(TimeoutError, match=rf"Waited 1s .* for '{named}', the lock .* stale.*: `rm {named}`"):
        strategy.setup_distributed()
    assert time.monotonic() - start < 20
    assert lock.exists()  # left for the user to remove: another job may be building


@needs_deepspeed
@pytest.mark.parametrize("cpu_checkpointing", [False, True])
def test_deepspeeds_cpu_checkpointing_loses_an_activation_already_on_the_cpu(
    ds_cpu: pytest.MonkeyPatch, cpu_checkpointing: bool
) -> None:
    """Not ours: lightning-habana's activation-checkpointing cases with ``cpu_checkpointing`` (and no
    ``partition_activations``) fail in emulation within DeepSpeed alone, no Lightning and no plugin here. Its
    ``checkpoint`` "copies" each input to the CPU with ``.to("cpu")``, the input itself when already there (DeepSpeed's
    CPU accelerator), then empties the input for memory (``arg.data = torch.empty([])``) and so keeps an empty copy
    for backward, which recomputes the layer on a scalar. On Gaudi the input is on the HPU and the copy is real.
    Canary: fails once DeepSpeed copies or keeps the data (then the peer cases pass in emulation)."""
    from deepspeed.runtime.activation_checkpointing import checkpointing

    # what deepspeed.checkpointing.configure(cpu_checkpointing=...) sets, without its process group
    ds_cpu.setattr(checkpointing, "PARTITION_ACTIVATIONS", False)
    ds_cpu.setattr(checkpointing, "CPU_CHECKPOINT", cpu_checkpointing)
    weight = torch.nn.Parameter(torch.ones(10))
    hidden = torch.ones(2, 10) * weight  # lightning-habana's SampleLayer on a batch of 2
    out = checkpointing.checkpoint(lambda x: x * weight, hidden)
    if not cpu_checkpointing:
        out.sum().backward()
        torch.testing.assert_close(weight.grad, torch.full((10,), 4.0))
        return
    with pytest.raises(RuntimeError, match=r"Mismatch in shape: grad_output\[0\] .*\[2, 10\].* output\[0\] .*\[10\]\)"):
        out.sum().backward()
