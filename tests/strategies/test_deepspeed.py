"""``hpu_deepspeed`` without starting processes: names, bad input refused before anything starts, DeepSpeed's
accelerator choice, gradient clipping from the Trainer, and the real (bridge) path's set-up calls."""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.plugins.precision import DeepSpeedPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, StrategyRegistry
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi import HPUAccelerator, HPUDeepSpeedStrategy, HPUPrecision, hpu
from lightning_gaudi.distributed import rendezvous
from lightning_gaudi.hpu import deepspeed_accelerator
from lightning_gaudi.hpu.deepspeed_accelerator import DeepSpeedMissingError, deepspeed_accelerator_name
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
def test_lightnings_strategy_instance_is_refused_with_the_fix(ds_cpu: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match=r"pass lightning_gaudi's `HPUDeepSpeedStrategy\(\.\.\.\)` instead"):
        Trainer(accelerator="hpu", strategy=DeepSpeedStrategy(), devices=2, logger=False)


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
