"""The lightning-gaudi console script: HPU names on the command line, strategy knobs from the command line and from
YAML, callbacks by class path, runtime settings, --print_config round trips, no example defaults on a user's model,
and one real fit of the example through examples/cli.py."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from gpt_recipe.data import StdlibTextDataModule
from gpt_recipe.model import GPTLanguageModel

from lightning_gaudi import HPUAccelerator, HPUParallelStrategy, SingleHPUStrategy, hpu
from lightning_gaudi.app.cli import GaudiCLI, main
from lightning_gaudi.callbacks import MarkStep, MemoryStats
from lightning_gaudi.profilers import HPUProfiler

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE_CONFIG = ROOT / "examples" / "gpt_recipe" / "cli.yaml"

# in-process CLIs get their arguments from `args`, not from pytest's own command line
pytestmark = [
    pytest.mark.filterwarnings("ignore:LightningCLI's args parameter is intended"),
    pytest.mark.filterwarnings("ignore:Starting from v1.9.0, `tensorboardX` has been removed"),
]

TINY = [
    "--model=gpt_recipe.model.GPTLanguageModel",
    "--data=gpt_recipe.data.StdlibTextDataModule",
    "--model.n_layer=1",
    "--model.n_embd=16",
    "--model.n_head=2",
    "--model.block_size=16",
    "--data.seq_len=16",
    "--data.batch_size=4",
    "--data.max_bytes=20000",
]


@pytest.fixture
def cli_env(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    monkeypatch.chdir(tmp_path)
    saved = dict(os.environ)
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


def _cli(args: list[str]) -> GaudiCLI:
    return GaudiCLI(args=[*TINY, *args], run=False)


def test_console_script_is_declared() -> None:
    scripts = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="console_scripts")}
    assert scripts.get("lightning-gaudi") == "lightning_gaudi.app.cli:main"


def test_example_config_trains_the_example_on_the_hpu(cli_env: Path) -> None:
    cli = GaudiCLI(args=[f"--config={EXAMPLE_CONFIG}"], run=False)
    assert isinstance(cli.model, GPTLanguageModel)
    assert isinstance(cli.datamodule, StdlibTextDataModule)
    assert isinstance(cli.trainer.accelerator, HPUAccelerator)
    assert isinstance(cli.trainer.strategy, SingleHPUStrategy)
    assert cli.trainer.max_steps == 300
    assert cli.trainer.gradient_clip_val == 1.0


def test_a_users_model_gets_lightnings_defaults_on_one_hpu(cli_env: Path) -> None:
    """The example's tuned values (clipping, 300 steps, validation every 100) stay in its own config."""
    cli = GaudiCLI(args=["--model=gpt_recipe.model.GPTLanguageModel", *TINY[1:]], run=False)
    assert isinstance(cli.trainer.accelerator, HPUAccelerator)
    assert cli.trainer.num_devices == 1
    assert cli.trainer.max_steps == -1
    assert cli.trainer.gradient_clip_val is None
    assert cli.trainer.val_check_interval == 1.0
    assert cli.trainer.log_every_n_steps == 50


def test_runtime_settings_are_applied_before_the_trainer(cli_env: Path) -> None:
    cli = _cli(["--runtime.emulated_devices=3", "--runtime.autocast_fp32_ops=[softmax]", "--trainer.devices=3"])
    assert os.environ[hpu.DEVICES_ENV] == "3"
    assert cli.trainer.num_devices == 3
    assert hpu.Runtime.from_env().autocast_fp32_ops == ("softmax",)
    with pytest.raises(ValueError, match=r"'linaer'.*Did you mean 'linear'"):
        _cli(["--runtime.autocast_bf16_ops=[linaer]"])


def test_hpu_names_work_on_the_command_line(cli_env: Path) -> None:
    cli = _cli(["--trainer.accelerator=hpu", "--trainer.strategy=hpu_parallel", "--trainer.devices=2"])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, HPUParallelStrategy)
    assert isinstance(cli.trainer.accelerator, HPUAccelerator)
    assert cli.trainer.num_devices == 2


def test_strategy_knobs_from_the_command_line(cli_env: Path) -> None:
    cli = _cli(
        [
            "--trainer.strategy=lightning_gaudi.HPUParallelStrategy",
            "--trainer.strategy.bucket_cap_mb=8",
            "--trainer.strategy.static_graph=true",
            "--trainer.devices=2",
        ]
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy, HPUParallelStrategy)
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 8
    assert strategy.ddp_kwargs["static_graph"] is True
    assert cli.trainer.num_devices == 2


def test_strategy_knobs_and_callbacks_from_yaml(cli_env: Path) -> None:
    config = cli_env / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "trainer": {
                    "devices": 2,
                    "strategy": {
                        "class_path": "lightning_gaudi.HPUParallelStrategy",
                        "init_args": {"bucket_cap_mb": 3, "gradient_as_bucket_view": False},
                    },
                    "callbacks": [
                        {"class_path": "lightning_gaudi.callbacks.MarkStep", "init_args": {"after_forward": True}},
                        {"class_path": "lightning_gaudi.callbacks.MemoryStats"},
                    ],
                }
            }
        )
    )
    cli = _cli([f"--config={config}"])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, HPUParallelStrategy)
    assert strategy.ddp_kwargs["bucket_cap_mb"] == 3
    assert strategy.ddp_kwargs["gradient_as_bucket_view"] is False
    mark_steps = [c for c in cli.trainer.callbacks if isinstance(c, MarkStep)]
    assert len(mark_steps) == 1
    assert mark_steps[0].after_forward is True
    assert any(isinstance(c, MemoryStats) for c in cli.trainer.callbacks)


def test_callbacks_by_class_path_on_the_command_line(cli_env: Path) -> None:
    cli = _cli(["--trainer.callbacks+=lightning_gaudi.callbacks.MemoryStats", "--trainer.callbacks.cpu_stats=true"])
    stats = [c for c in cli.trainer.callbacks if isinstance(c, MemoryStats)]
    assert len(stats) == 1
    assert vars(stats[0]).get("log_every_n_steps") is None


def test_hpu_profiler_by_class_path(cli_env: Path) -> None:
    cli = _cli(
        [
            "--trainer.profiler=lightning_gaudi.profilers.HPUProfiler",
            "--trainer.profiler.init_args.wait_steps=7",
            "--trainer.profiler.init_args.active_steps=2",
        ]
    )
    profiler = cli.trainer.profiler
    assert isinstance(profiler, HPUProfiler)
    assert (profiler.wait_steps, profiler.active_steps) == (7, 2)


def test_hpu_profiler_trace_folder_by_class_path(cli_env: Path) -> None:
    cli = _cli(
        [
            "--trainer.profiler=lightning_gaudi.profilers.HPUProfiler",
            f"--trainer.profiler.init_args.dirpath={cli_env / 'traces'}",
            "--trainer.profiler.init_args.row_limit=5",
        ]
    )
    assert isinstance(cli.trainer.profiler, HPUProfiler)
    assert cli.trainer.profiler.dirpath == str(cli_env / "traces")


def _print_config(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as info:
        main(["fit", *args, "--print_config"])
    assert info.value.code in (0, None)
    return capsys.readouterr().out


def test_print_config_round_trips(cli_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [
        *TINY,
        "--trainer.strategy=lightning_gaudi.HPUParallelStrategy",
        "--trainer.strategy.bucket_cap_mb=16",
        "--trainer.devices=2",
        "--trainer.callbacks+=lightning_gaudi.callbacks.MarkStep",
    ]
    first = _print_config(args, capsys)
    parsed = yaml.safe_load(first)
    assert parsed["model"]["class_path"] == "gpt_recipe.model.GPTLanguageModel"
    assert parsed["runtime"]["execution_mode"] is None
    assert parsed["trainer"]["strategy"]["init_args"]["bucket_cap_mb"] == 16
    saved = cli_env / "printed.yaml"
    saved.write_text(first)
    second = _print_config([f"--config={saved}"], capsys)
    assert yaml.safe_load(second) == parsed  # equal values (an int default may come back as a float: 20 == 20.0)


@pytest.mark.subprocess
def test_fit_with_the_example_cli(tmp_path: Path) -> None:
    """`examples/cli.py fit --config examples/gpt_recipe/cli.yaml` trains the example; without settings it emulates
    and says so, and leaves upstream notices nobody asked for off the console."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIGHTNING_GAUDI_")}
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "cli.py"),
            "fit",
            f"--config={EXAMPLE_CONFIG}",
            *TINY[2:],
            "--trainer.max_steps=3",
            "--trainer.limit_val_batches=1",
            "--trainer.val_check_interval=3",
            f"--trainer.default_root_dir={tmp_path}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    if not hpu.bridge_installed():
        assert "EMULATED on the CPU in eager mode" in output
    assert "`Trainer.fit` stopped: `max_steps=3` reached." in output
    assert "LeafSpec" not in output
    assert "Tip:" not in output
    assert list(tmp_path.glob("lightning_logs/version_0/checkpoints/*.ckpt"))
    assert (tmp_path / "lightning_logs" / "version_0" / "config.yaml").is_file()


def test_fit_resumes_under_the_auto_policy(cli_env: Path) -> None:
    """`--ckpt_path auto` starts fresh when the checkpoint folder is empty and resumes from its newest checkpoint."""
    ckpts = cli_env / "ckpts"
    common = [
        *TINY,
        "--trainer.callbacks=ModelCheckpoint",
        f"--trainer.callbacks.dirpath={ckpts}",
        "--trainer.limit_val_batches=0",
        "--trainer.logger=false",
        "--trainer.enable_progress_bar=false",
        "--ckpt_path=auto",
    ]
    first = GaudiCLI(args=["fit", *common, "--trainer.max_steps=2"], save_config_callback=None)
    assert first.trainer.ckpt_path is None
    [saved] = list(ckpts.glob("*.ckpt"))
    second = GaudiCLI(args=["fit", *common, "--trainer.max_steps=3"], save_config_callback=None)
    assert second.trainer.ckpt_path == str(saved)
    assert second.trainer.global_step == 3


@pytest.mark.subprocess
def test_a_model_in_the_working_directory_imports_by_name(tmp_path: Path) -> None:
    """``lightning-gaudi fit --model mymod.Net`` in the folder that holds ``mymod.py``, as ``python -m`` finds it."""
    script = Path(sys.executable).parent / "lightning-gaudi"
    if not script.exists():
        pytest.skip(f"the console script is not installed next to {sys.executable}")
    (tmp_path / "mymod.py").write_text(
        "from lightning.pytorch.demos.boring_classes import BoringModel\n\nclass Net(BoringModel):\n    pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    env["LIGHTNING_GAUDI_EMULATE"] = "eager"
    data = "lightning.pytorch.demos.boring_classes.BoringDataModule"
    flags = ["--trainer.fast_dev_run", "1", "--trainer.logger", "false"]
    done = subprocess.run(
        [str(script), "fit", "--model", "mymod.Net", "--data", data, *flags],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
