"""The Hydra recipes under conf/: every option composes and builds its objects; schemas reject typos and wrong
types; the run-directory resolvers agree across ranks; the SLURM launcher recipe is checked against the trainer."""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

import lightning as L
import pytest
from helpers.configs import CONF_DIR, compose_train
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException, MissingConfigException
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig, OmegaConf

import lightning_gaudi.app.hydra as lg_hydra
from lightning_gaudi import (
    HPUDeepSpeedStrategy,
    HPUFSDPStrategy,
    HPUModelParallelStrategy,
    HPUParallelStrategy,
    SingleHPUStrategy,
    callbacks,
    hpu,
)
from lightning_gaudi.app.hydra import ranks
from lightning_gaudi.app.hydra.schemas import CALLBACK_CONFIG_NAMES, SlurmLauncherConf, check_slurm_launcher
from lightning_gaudi.distributed import DEFAULT_TIMEOUT, InvalidLaunchError
from lightning_gaudi.profilers import HPUProfiler

#: Small enough that building every model is quick.
TINY = ["data.max_bytes=20000", "data.seq_len=16", "data.batch_size=4"]


#: hparams_search recipes that run Hydra's Optuna sweeper (the `optuna` extra).
OPTUNA_RECIPES = ("gpt_optuna",)


def _installed(name: str) -> bool:
    try:  # find_spec raises, instead of returning None, when a parent package (hydra_plugins) is missing
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


_needs_optuna = pytest.mark.skipif(
    not _installed("hydra_plugins.hydra_optuna_sweeper"),
    reason="Hydra's Optuna sweeper is not installed (pip install '.[optuna]')",
)


#: Options that build DeepSpeed (the `deepspeed` extra, which scripts/setup.sh installs for CI).
DEEPSPEED_OPTIONS = ("strategy=hpu_deepspeed", "experiment=gpt_zero")
_needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed (pip install '.[deepspeed]')"
)


def group_options(group: str) -> list[str]:
    return sorted(path.stem for path in (CONF_DIR / group).glob("*.yaml"))


def build_all(cfg: DictConfig) -> dict[str, Any]:
    """Instantiates what train() instantiates, without fitting."""
    lg_hydra.prepare(cfg)
    built_callbacks = lg_hydra.instantiate_group(cfg.get("callbacks"))
    loggers = lg_hydra.instantiate_group(cfg.get("logger"))
    data = instantiate(cfg.data)
    model = instantiate(cfg.model)
    strategy = instantiate(cfg.strategy)
    profiler = {"profiler": instantiate(cfg.profiler)} if cfg.get("profiler") else {}
    trainer = instantiate(
        cfg.trainer, strategy=strategy, callbacks=built_callbacks, logger=loggers or False, **profiler
    )
    return {"callbacks": built_callbacks, "loggers": loggers, "data": data, "model": model, "trainer": trainer}


_CASES = [
    *(
        f"{group}={option}"
        for group in ("strategy", "model", "data", "logger", "profiler")
        for option in group_options(group)
    ),
    *(f"callbacks={option}" for option in group_options("callbacks")),
    *(f"experiment={option}" for option in group_options("experiment")),
    *(
        pytest.param(f"hparams_search={option}", marks=_needs_optuna)
        if option in OPTUNA_RECIPES
        else f"hparams_search={option}"
        for option in group_options("hparams_search")
    ),
    *(f"debug={option}" for option in group_options("debug")),
]


_CASES = [pytest.param(case, marks=_needs_deepspeed) if case in DEEPSPEED_OPTIONS else case for case in _CASES]


@pytest.mark.parametrize("selection", _CASES)
def test_every_option_composes_and_instantiates(
    selection: str, isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train([selection, *TINY], output_dir=tmp_path)
    built = build_all(cfg)
    trainer = built["trainer"]
    assert isinstance(trainer, L.Trainer)
    assert isinstance(built["model"], L.LightningModule)
    assert isinstance(built["data"], L.LightningDataModule)
    assert isinstance(
        trainer.strategy,
        (SingleHPUStrategy, HPUParallelStrategy, HPUFSDPStrategy, HPUDeepSpeedStrategy, HPUModelParallelStrategy),
    )
    names = [name for name, node in (cfg.callbacks or {}).items() if isinstance(node, DictConfig)]
    assert len(built["callbacks"]) == len(names)
    assert all(isinstance(c, Callback) for c in built["callbacks"])
    for callback in built["callbacks"]:
        assert callback in trainer.callbacks
    if isinstance(trainer.strategy, HPUParallelStrategy):
        assert trainer.strategy.ddp_kwargs.get("bucket_cap_mb") == cfg.strategy.bucket_cap_mb or (
            cfg.strategy.bucket_cap_mb is None and "bucket_cap_mb" not in trainer.strategy.ddp_kwargs
        )
    assert isinstance(trainer.profiler, HPUProfiler) == (selection == "profiler=hpu")


def test_profiler_is_off_unless_chosen_and_hpu_traces_into_the_run_folder(tmp_path: Path) -> None:
    assert compose_train([], output_dir=tmp_path).profiler is None
    assert compose_train(["profiler=none"], output_dir=tmp_path).profiler is None
    cfg = compose_train(["profiler=hpu", "profiler.wait_steps=1", "profiler.record_shapes=true"], output_dir=tmp_path)
    assert cfg.profiler._target_ == "lightning_gaudi.profilers.HPUProfiler"
    assert cfg.profiler.dirpath == f"{tmp_path}/profiler"
    assert (cfg.profiler.wait_steps, cfg.profiler.active_steps, cfg.profiler.record_shapes) == (1, 5, True)


def test_every_callback_file_has_a_real_class_and_schema() -> None:
    """Each plugin callback recipe names a class lightning_gaudi.callbacks exports (never a missing one)."""
    for name in group_options("callbacks"):
        node = OmegaConf.load(CONF_DIR / "callbacks" / f"{name}.yaml")
        for key, value in node.items():
            if key == "defaults" or not isinstance(value, DictConfig):
                continue
            cfg = compose_train([f"callbacks={name}"], output_dir=Path("."))
            target = cfg.callbacks[key]._target_
            if target.startswith("lightning_gaudi."):
                class_name = target.rsplit(".", 1)[1]
                assert hasattr(callbacks, class_name), target
                assert CALLBACK_CONFIG_NAMES[key] == class_name


def test_default_callback_set_is_the_gaudi_set() -> None:
    cfg = compose_train([], output_dir=Path("."))
    assert list(cfg.callbacks) == [
        "model_checkpoint",
        "progress_bar",
        "lr_monitor",
        "mark_step",
        "memory_stats",
        "throughput",
    ]
    assert not compose_train(["callbacks=none"], output_dir=Path(".")).callbacks


def test_bucket_sweep_is_a_multirun_over_bucket_sizes_on_two_cards() -> None:
    cfg = compose_train(["hparams_search=bucket_sweep"], hydra=True)
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert cfg.hydra.sweeper.params["strategy.bucket_cap_mb"] == "1,4,16,64"
    assert cfg.strategy._target_ == "lightning_gaudi.HPUParallelStrategy"
    assert cfg.trainer.devices == 2
    assert cfg.optimized_metric == "samples_per_sec"
    sweeps = str(cfg.hydra.sweep.dir).rsplit("/", 1)[0]
    assert sweeps == "logs/bucket_sweep/multiruns"
    # the recipe's own instructions point at the folder its jobs write to
    assert f"python scripts/sweep_report.py {sweeps}" in (CONF_DIR / "hparams_search" / "bucket_sweep.yaml").read_text()


def test_optuna_search_minimises_validation_perplexity_over_lr_and_batch_size() -> None:
    pytest.importorskip(
        "hydra_plugins.hydra_optuna_sweeper", reason="Hydra's Optuna sweeper is not installed (pip install '.[optuna]')"
    )
    cfg = compose_train(["hparams_search=gpt_optuna"], hydra=True)
    sweeper = cfg.hydra.sweeper
    assert cfg.hydra.mode.name == "MULTIRUN"
    assert sweeper._target_ == "hydra_plugins.hydra_optuna_sweeper.optuna_sweeper.OptunaSweeper"
    assert cfg.optimized_metric == "val/ppl"
    assert str(sweeper.direction) in ("minimize", "Direction.minimize")
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.sampler.seed == cfg.seed
    assert dict(sweeper.params) == {
        "model.lr": "tag(log, interval(1e-4, 1e-2))",
        "data.batch_size": "choice(8, 16, 32, 64)",
    }
    # every trial sees the same text once (one epoch), so batch sizes are compared on equal data
    assert (cfg.trainer.max_steps, cfg.trainer.max_epochs, cfg.trainer.val_check_interval) == (-1, 1, 1.0)
    assert cfg.callbacks.model_checkpoint is None
    assert cfg.trainer.enable_checkpointing is False
    sweeps = str(cfg.hydra.sweep.dir).rsplit("/", 1)[0]
    assert sweeps == "logs/gpt_optuna/multiruns"
    assert f"python scripts/sweep_report.py {sweeps}" in (CONF_DIR / "hparams_search" / "gpt_optuna.yaml").read_text()
    # the sweeper's own search-space syntax parses into what it hands Optuna
    from hydra_plugins.hydra_optuna_sweeper._impl import create_params_from_overrides
    from optuna.distributions import CategoricalDistribution, LogUniformDistribution

    space, fixed = create_params_from_overrides([f"{k}={v}" for k, v in sweeper.params.items()])
    assert fixed == {}
    assert space["model.lr"] == LogUniformDistribution(1e-4, 1e-2)
    assert space["data.batch_size"] == CategoricalDistribution([8, 16, 32, 64])


def test_optuna_search_runs_multi_card_trials(no_launcher: pytest.MonkeyPatch) -> None:
    """Each trial is a job like any other: on several cards the app starts one process per card for it."""
    pytest.importorskip(
        "hydra_plugins.hydra_optuna_sweeper", reason="Hydra's Optuna sweeper is not installed (pip install '.[optuna]')"
    )
    no_launcher.setenv(hpu.EMULATE_ENV, "eager")
    cfg = compose_train(["hparams_search=gpt_optuna", "strategy=hpu_parallel", "trainer.devices=2"])
    assert ranks.needs_rank_launch(cfg)


def test_user_override_paths() -> None:
    cfg = compose_train(
        ["trainer.max_steps=7", "trainer.devices=2", "strategy=hpu_parallel", "strategy.bucket_cap_mb=3.5"],
        output_dir=Path("."),
    )
    assert cfg.trainer.max_steps == 7
    assert cfg.trainer.devices == 2
    assert cfg.strategy._target_ == "lightning_gaudi.HPUParallelStrategy"
    assert cfg.strategy.bucket_cap_mb == 3.5
    # the recipe's timeout is the strategy's own default (10 minutes), in seconds
    assert cfg.strategy.timeout == DEFAULT_TIMEOUT.total_seconds()
    assert instantiate(cfg.strategy).timeout == DEFAULT_TIMEOUT
    assert instantiate(compose_train(["strategy=hpu_parallel", "strategy.timeout=90"]).strategy).timeout.seconds == 90


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["strategy=hpu_parallel", "strategy.bucket_cap_mbb=3"], "bucket_cap_mbb"),
        (["strategy.bucket_cap_mb=3"], "bucket_cap_mb"),  # hpu_single has no buckets
        (["callbacks.mark_step.after_backwardd=true"], "after_backwardd"),
        (["runtime.emulatee=true"], "emulatee"),
        (["profiler=hpu", "profiler.wait_stepz=1"], "wait_stepz"),
        (["hydra/launcher=gaudi_slurm", "hydra.launcher.tasks_per_nodee=2"], "tasks_per_nodee"),
    ],
)
def test_typo_is_an_error_naming_the_key(overrides: list[str], key: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(overrides, hydra=True)
    text = f"{info.value} {info.value.__cause__}"
    assert f"'{key}'" in text


@pytest.mark.parametrize(
    ("overrides", "field", "expected"),
    [
        (["strategy=hpu_parallel", "strategy.bucket_cap_mb=big"], "strategy.bucket_cap_mb", "Float"),
        (["strategy=hpu_parallel", "strategy.static_graph=maybe"], "strategy.static_graph", "bool"),
        (["callbacks.memory_stats.cpu_stats=maybe"], "callbacks.memory_stats.cpu_stats", "bool"),
        (["runtime.emulate=maybe"], "runtime.emulate", "bool"),
        (["runtime.emulated_devices=many"], "runtime.emulated_devices", "Integer"),
        (["runtime.autocast_fp32_ops=softmax"], "runtime.autocast_fp32_ops", "ListConfig"),
        (["profiler=hpu", "profiler.wait_steps=few"], "profiler.wait_steps", "Integer"),
        (["profiler=hpu", "profiler.with_stack=maybe"], "profiler.with_stack", "bool"),
    ],
)
def test_wrong_type_is_an_error_naming_the_field(overrides: list[str], field: str, expected: str) -> None:
    with pytest.raises(ConfigCompositionException) as info:
        compose_train(overrides)
    cause = str(info.value.__cause__)
    assert f"full_key: {field}" in cause
    assert expected in cause


def test_missing_option_lists_the_choices() -> None:
    with pytest.raises(MissingConfigException) as info:
        compose_train(["strategy=hpu_paralel"])
    message = str(info.value)
    assert "strategy/hpu_paralel" in message
    assert "hpu_parallel" in message
    assert "hpu_single" in message
    assert "lightning_gaudi_schema" not in message.split("Config search path")[0]


def test_malformed_config_file_names_the_file(tmp_path: Path) -> None:
    conf = tmp_path / "conf"
    (conf / "strategy").mkdir(parents=True)
    (conf / "train.yaml").write_text("defaults:\n  - strategy: broken\n  - _self_\nseed: 1\n")
    (conf / "strategy" / "broken.yaml").write_text("_target_: lightning_gaudi.HPUParallelStrategy\nbucket_cap_mb: [1\n")
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"), pytest.raises(Exception, match="broken"):
        compose("train")


def test_rank_config_errors_are_clear(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="No rank config"):
        ranks.load_rank_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [1\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        ranks.load_rank_config(bad)
    partial = tmp_path / "partial.yaml"
    partial.write_text("trainer: {}\n")
    with pytest.raises(ValueError, match=r"lacks \['strategy', 'runtime'\]"):
        ranks.load_rank_config(partial)
    assert ranks.main([str(tmp_path / "missing.yaml"), "gpt_recipe.task:train"]) == 2
    assert ranks.main([str(tmp_path / "missing.yaml")]) == 2
    cfg = tmp_path / "rank_config.yaml"
    cfg.write_text("trainer: {}\nstrategy: {}\nruntime: {}\n")
    assert ranks.main([str(cfg), "gpt_recipe.task:no_such_function"]) == 2


def test_a_runtime_mistake_stops_the_job_before_it_starts(isolated_env: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="emulated_device_name='GAUDI9'"):
        lg_hydra.prepare(compose_train(["runtime.emulated_device_name=GAUDI9"]))
    with pytest.raises(ValueError, match=r"'linaer'.*Did you mean 'linear'"):
        lg_hydra.prepare(compose_train(["runtime.autocast_bf16_ops=[linaer]"]))
    assert hpu.EMULATE_ENV not in os.environ  # nothing was applied


# ---------------------------------------------------------------- emulation defaults


def _emulation_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "emulat" in r.getMessage().lower()]


def test_auto_emulation_switches_to_eager_and_says_so_once(
    isolated_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """One line says what runs (emulation, mode, cards used, strategy), after Lightning's device lines."""
    isolated_env.setattr(hpu.runtime, "bridge_installed", lambda: False)
    with caplog.at_level(logging.INFO):
        trainer = build_all(compose_train(TINY, output_dir=tmp_path))["trainer"]
        trainer.strategy._prepare_trainer(trainer)  # what the strategy's set-up runs when the fit starts
    assert os.environ[hpu.EMULATE_ENV] == "eager"
    lines = _emulation_lines(caplog)
    assert len(lines) == 1, lines
    assert lines[0].startswith("HPU available: True (GAUDI2, EMULATED on the CPU in eager mode, ")
    assert "using: 1 HPU, strategy SingleHPUStrategy." in lines[0]
    assert "(LIGHTNING_GAUDI_EMULATE=eager; Intel's bridge is not installed)" in lines[0]


def test_auto_emulation_keeps_the_users_choice(
    isolated_env: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "lazy")
    with caplog.at_level(logging.INFO):
        trainer = build_all(compose_train(TINY, output_dir=tmp_path))["trainer"]
        trainer.strategy._prepare_trainer(trainer)
    assert os.environ[hpu.EMULATE_ENV] == "lazy"
    lines = _emulation_lines(caplog)
    assert len(lines) == 1, lines
    assert "EMULATED on the CPU in lazy mode" in lines[0]


def test_explicit_runtime_settings(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    settings = lg_hydra.prepare(
        compose_train(
            [
                "runtime.emulate=true",
                "runtime.emulated_devices=3",
                "runtime.emulated_device_name=GAUDI3",
                "runtime.int64_support=true",
                f"runtime.recipe_cache={{path: {tmp_path}, max_size_mb: 64}}",
                "runtime.autocast_fp32_ops=[softmax,nll_loss]",
                f"runtime.autocast_list_dir={tmp_path / 'lists'}",
            ]
        )
    )
    assert (os.environ[hpu.EMULATE_ENV], os.environ[hpu.DEVICES_ENV], os.environ[hpu.DEVICE_NAME_ENV]) == (
        "eager",
        "3",
        "GAUDI3",
    )
    assert os.environ["PT_ENABLE_INT64_SUPPORT"] == "1"
    assert os.environ["PT_HPU_RECIPE_CACHE_CONFIG"] == f"{tmp_path},false,64"
    assert (tmp_path / "lists" / "autocast_fp32_ops.txt").read_text() == "softmax\nnll_loss\n"
    assert settings.autocast_fp32_ops == ("softmax", "nll_loss")
    assert hpu.get_backend().device_count() == 3
    hpu.configure(emulate=False)
    assert hpu.EMULATE_ENV not in os.environ


def test_execution_mode_picks_the_emulator(isolated_env: pytest.MonkeyPatch) -> None:
    isolated_env.setattr(hpu.runtime, "bridge_installed", lambda: False)
    lg_hydra.prepare(compose_train(["experiment=gpt_lazy"]))
    assert os.environ[hpu.EMULATE_ENV] == "lazy"
    assert hpu.get_backend().is_lazy()


def test_on_gaudi_resolver_picks_by_backend(isolated_env: pytest.MonkeyPatch) -> None:
    isolated_env.setattr(hpu.runtime, "bridge_installed", lambda: True)
    assert compose_train([]).trainer.precision == "bf16-mixed"
    assert compose_train(["experiment=gpt_gaudi"]).runtime.execution_mode == "compile"
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    assert compose_train([]).trainer.precision == "32-true"
    assert compose_train(["experiment=gpt_gaudi"]).runtime.execution_mode is None


# ---------------------------------------------------------------- ranks and run directories

_LAUNCHER_ENV = (
    "LIGHTNING_GAUDI_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_PROCID",
    "SLURM_STEP_ID",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_JOB_NAME",
    "TORCHELASTIC_RUN_ID",
    "RANK",
    "LOCAL_RANK",
    "NODE_RANK",
    "GROUP_RANK",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "MASTER_PORT",
)


@pytest.fixture
def no_launcher(isolated_env: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in _LAUNCHER_ENV:
        isolated_env.delenv(name, raising=False)
    return isolated_env


def _hydra_dirs(monkeypatch: pytest.MonkeyPatch, rank_env: dict[str, str]) -> tuple[str, Any, str]:
    with monkeypatch.context() as m:
        for name, value in rank_env.items():
            m.setenv(name, value)
        cfg = compose_train([], hydra=True)
        hydra_cfg = cfg.hydra
        hydra_cfg.runtime.output_dir = "OUT"
        return (
            str(hydra_cfg.run.dir),
            hydra_cfg.output_subdir,
            str(hydra_cfg.job_logging.handlers.file.filename).removeprefix(f"OUT/{hydra_cfg.job.name}"),
        )


@pytest.mark.parametrize(
    ("shared", "expected_id"),
    [
        ({"LIGHTNING_GAUDI_RUN_ID": "exp42"}, "exp42"),
        ({"SLURM_JOB_ID": "777", "SLURM_STEP_ID": "3"}, "slurm-777-3"),
        ({"TORCHELASTIC_RUN_ID": "abc", "GROUP_RANK": "0", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, "torchrun-abc"),
    ],
)
def test_ranks_agree_on_one_run_dir_and_only_rank_zero_writes_hydra_files(
    no_launcher: pytest.MonkeyPatch, shared: dict[str, str], expected_id: str
) -> None:
    def rank_env(rank: int) -> dict[str, str]:
        env = dict(shared)
        if "SLURM_JOB_ID" in shared:
            env["SLURM_PROCID"] = str(rank)
        else:
            env.update(RANK=str(rank), LOCAL_RANK=str(rank))
        return env

    zero = _hydra_dirs(no_launcher, rank_env(0))
    one = _hydra_dirs(no_launcher, rank_env(1))
    assert zero[0] == one[0]
    assert zero[0].endswith(f"/runs/{expected_id}")
    assert (zero[1], one[1]) == (".hydra", None)
    assert zero[2] == ".log"
    assert one[2] == "_rank1.log"


def test_single_process_run_dir_is_timestamped(no_launcher: pytest.MonkeyPatch) -> None:
    run_dir, subdir, _ = _hydra_dirs(no_launcher, {})
    assert run_dir.startswith("logs/train/runs/20")
    assert subdir == ".hydra"


def test_needs_rank_launch(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv(hpu.EMULATE_ENV, "eager")
    single = compose_train([])
    ddp = compose_train(["strategy=hpu_parallel", "trainer.devices=2"])
    assert not ranks.needs_rank_launch(single)
    assert ranks.needs_rank_launch(ddp)
    assert not ranks.needs_rank_launch(compose_train(["strategy=hpu_parallel", "trainer.devices=1"]))
    assert not ranks.needs_rank_launch(
        compose_train(["strategy=hpu_parallel", "trainer.devices=2", "strategy.start_method=spawn"])
    )
    no_launcher.setenv("LOCAL_RANK", "0")  # a launcher started this process
    assert not ranks.needs_rank_launch(ddp)


# ---------------------------------------------------------------- SLURM launcher recipe


def test_slurm_launcher_recipe_matches_the_plugin_schema_and_the_trainer() -> None:
    cfg = compose_train(["hydra/launcher=gaudi_slurm", "trainer.devices=4", "trainer.num_nodes=2"], hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_ == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    fields = {f.name for f in SlurmLauncherConf.__dataclass_fields__.values()}
    assert set(launcher) <= fields
    assert (launcher.tasks_per_node, launcher.nodes) == (4, 2)
    check_slurm_launcher(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["hydra.launcher.tasks_per_node=2", "trainer.devices=4"], "tasks_per_node=2 but trainer.devices=4"),
        (["hydra.launcher.nodes=3"], "nodes=3 but trainer.num_nodes=1"),
        (["trainer.devices=auto"], "needs a card count"),
    ],
)
def test_slurm_launcher_check_rejects_a_mismatch(overrides: list[str], message: str) -> None:
    cfg = compose_train(["hydra/launcher=gaudi_slurm", *overrides], hydra=True)
    with pytest.raises(ValueError, match=message):
        check_slurm_launcher(cfg)


def test_slurm_tasks_per_node_is_checked_inside_the_job(no_launcher: pytest.MonkeyPatch) -> None:
    no_launcher.setenv(hpu.EMULATE_ENV, "eager")
    no_launcher.setenv(hpu.DEVICES_ENV, "8")  # enough cards: the mismatch is with the Trainer's devices
    no_launcher.setenv("SLURM_NTASKS", "3")
    no_launcher.setenv("SLURM_NTASKS_PER_NODE", "3")
    no_launcher.setenv("SLURM_JOB_NAME", "train")
    with pytest.raises(InvalidLaunchError, match="SLURM") as info:
        lg_hydra.prepare(compose_train(["strategy=hpu_parallel", "trainer.devices=2"]))
    assert "3" in str(info.value)
    assert "devices=2" in str(info.value)
    no_launcher.setenv("SLURM_NTASKS_PER_NODE", "2")
    no_launcher.setenv("SLURM_NTASKS", "2")
    lg_hydra.prepare(compose_train(["strategy=hpu_parallel", "trainer.devices=2"]))


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["strategy=hpu_fsdp", "trainer.precision=fp8"], "`precision='fp8'` is not supported with HPUFSDPStrategy"),
        (
            ["strategy=hpu_deepspeed", "+strategy.config.gradient_clipping=0.5", "trainer.gradient_clip_val=1.0"],
            "The DeepSpeed config has gradient_clipping=0.5, but the Trainer has gradient_clip_val=1.0",
        ),
    ],
)
def test_what_the_ranks_would_refuse_fails_before_any_rank_starts(
    overrides: list[str], match: str, isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    if "strategy=hpu_deepspeed" in overrides:
        pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    isolated_env.setenv(hpu.DEVICES_ENV, "2")
    isolated_env.setattr(lg_hydra, "launch_ranks", lambda *args: pytest.fail("a rank process was started"))
    cfg = compose_train([*TINY, "trainer.devices=2", *overrides], output_dir=tmp_path)
    with pytest.raises(ValueError, match=match):
        lg_hydra.run(cfg, lambda cfg: pytest.fail("the task ran"))
