"""LitGPT (Lightning AI's LLM toolkit, code this project did not write) end to end on the emulated HPU.

``litgpt pretrain`` and ``litgpt finetune_lora`` run unchanged through ``python -m lightning_gaudi litgpt ...`` on 1
and 2 emulated HPUs, and as the same command on the CPU with stock Lightning; the losses LitGPT prints and the weights
it saves must agree. On 2 devices LitGPT builds Lightning's ``FSDPStrategy`` (pretraining) and
``ModelParallelStrategy`` (LoRA) objects, which the HPU adopts; pretraining builds the model on the meta device
(``fabric.init_module(empty_init=True)``) and ``torch.compile``s it before ``fabric.setup``.

Everything is local and tiny: a word-level tokenizer built here, a 2-layer Pythia-style config, a few text files
(served by ``helpers.litgpt_text.LocalText``: LitGPT's ``TextFiles`` needs ``litdata``, which pulls another torch) and
a JSON instruction set (LitGPT's ``JSON`` module). Each process runs torch on one thread, as the emulator does, so
the CPU and the HPU runs reduce in the same order. The compiled 1-HPU pretraining runs dynamo with the emulated
backend ``aot_eager`` (the same aten ops as eager); the other runs leave compilation off (``TORCHDYNAMO_DISABLE``):
the CPU command would compile with inductor, whose fused kernels round differently.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TESTS_DIR
from helpers.shared_job import run_once
from lightning_utilities.core.imports import RequirementCache

from lightning_gaudi.hpu.runtime import COMPILE_BACKEND_ENV, DEVICES_ENV, EMULATE_ENV

LITGPT = RequirementCache("litgpt")
pytestmark = [
    pytest.mark.subprocess,
    pytest.mark.skipif(
        not LITGPT,
        reason=f"LitGPT is not installed ({LITGPT.message}); scripts/setup.sh installs litgpt==0.5.13 --no-deps",
    ),
]

ROOT = TESTS_DIR.parent
WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "big", "red", "and", "then"]
#: What LitGPT's Alpaca prompt adds around an instruction, so that the prompt tokenizes to known words.
PROMPT = "Below is an instruction that describes task. Write response appropriately completes request. ### Instruction:"
MODEL = {
    "name": "tiny-pythia",
    "block_size": 32,
    "vocab_size": 48,
    "padded_vocab_size": 64,
    "n_layer": 2,
    "n_head": 2,
    "n_embd": 32,
    "intermediate_size": 64,
    "rotary_percentage": 0.25,
    "parallel_residual": True,
    "bias": True,
    "norm_class_name": "LayerNorm",
    "mlp_class_name": "GptNeoxMLP",
}
TIMEOUT = 300
_LOSS = re.compile(r"loss train: ([\d.]+)|val loss: ([\d.]+)")


def _workspace(folder: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    rng = random.Random(0)
    text = folder / "text"
    text.mkdir(parents=True)
    for i, words in enumerate((120, 400, 400)):  # the first file is LocalText's validation set
        (text / f"part{i}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(words)))
    samples = [
        {"instruction": " ".join(rng.choices(WORDS, k=6)), "input": "", "output": " ".join(rng.choices(WORDS, k=5))}
        for _ in range(24)
    ]
    (folder / "sft").mkdir()
    (folder / "sft" / "train.json").write_text(json.dumps(samples[:20]))
    (folder / "sft" / "val.json").write_text(json.dumps(samples[20:]))

    vocabulary = list(dict.fromkeys(["<unk>", "<s>", "</s>", *WORDS, *PROMPT.split(), "Response:", "Input:"]))
    assert len(vocabulary) <= MODEL["vocab_size"], len(vocabulary)
    tokenizer = Tokenizer(models.WordLevel({word: i for i, word in enumerate(vocabulary)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    (folder / "tokenizer").mkdir()
    tokenizer.save(str(folder / "tokenizer" / "tokenizer.json"))
    config = {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "add_bos_token": True,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer" / "tokenizer_config.json").write_text(json.dumps(config))

    # JSON is YAML: the configs LitGPT reads with --config
    pretrain = {
        "model_name": "pythia-14m",
        "model_config": MODEL,
        "precision": "32-true",
        "tokenizer_dir": str(folder / "tokenizer"),
        "data": {"class_path": "helpers.litgpt_text.LocalText", "init_args": {"train_data_path": str(text)}},
        "train": {
            "save_interval": None,
            "log_interval": 1,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "max_tokens": 384,
            "max_seq_length": 16,
            "lr_warmup_steps": 2,
            "max_norm": 1.0,
            "min_lr": 1e-4,
        },
        "eval": {"interval": 1000, "max_iters": 2, "initial_validation": False, "final_validation": True},
        "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.01}},
        "logger_name": "csv",
        "seed": 7,
    }
    (folder / "pretrain.yaml").write_text(json.dumps(pretrain))
    finetune = {
        "precision": "32-true",
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.05,
        "lora_mlp": True,
        "data": {"class_path": "litgpt.data.JSON", "init_args": {"json_path": str(folder / "sft"), "num_workers": 0}},
        # max_steps ends the run inside the first epoch: at an epoch's end LitGPT generates a sample on rank 0 only,
        # which waits forever for the other rank under ModelParallelStrategy (stock, on the CPU too)
        "train": {
            "save_interval": None,
            "log_interval": 1,
            "global_batch_size": 4,
            "micro_batch_size": 2,
            "lr_warmup_steps": 1,
            "epochs": 1,
            "max_steps": 4,
            "max_seq_length": 32,
        },
        "eval": {"interval": 1000, "max_new_tokens": 4, "max_iters": 2, "final_validation": True},
        "optimizer": {"class_path": "torch.optim.AdamW", "init_args": {"lr": 0.01}},
        "logger_name": "csv",
        "seed": 11,
    }
    (folder / "finetune.yaml").write_text(json.dumps(finetune))


def _env(hpu: bool, compile_backend: str | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    path = [str(TESTS_DIR), str(ROOT), env.get("PYTHONPATH", "")]
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(filter(None, path)))
    if compile_backend is None:
        env["TORCHDYNAMO_DISABLE"] = "1"
    else:
        env.pop("TORCHDYNAMO_DISABLE", None)
        env[COMPILE_BACKEND_ENV] = compile_backend
    if hpu:
        env.update({EMULATE_ENV: "eager", DEVICES_ENV: "2"})
    return env


def _start(args: list[str], log: Path, hpu: bool, compile_backend: str | None = None) -> subprocess.Popen[bytes]:
    """``python -m lightning_gaudi litgpt ARGS`` on the emulated HPU, or ``litgpt ARGS`` on the CPU."""
    if hpu:
        command = [sys.executable, "-m", "lightning_gaudi", "litgpt", *args]
    elif args[0] == "pretrain" and args[args.index("--devices") + 1] != "1":
        # Fabric refuses Lightning's FSDPStrategy off GPUs by its exact class: the helper gives LitGPT a subclass
        command = [sys.executable, str(TESTS_DIR / "helpers" / "litgpt_cpu.py"), *args]
    else:
        command = [sys.executable, "-m", "litgpt", *args]
    handle = log.open("wb")
    return subprocess.Popen(command, cwd=log.parent, env=_env(hpu, compile_backend), stdout=handle, stderr=handle)


def _wait(runs: dict[str, subprocess.Popen[bytes]], folder: Path, expect_failure: tuple[str, ...] = ()) -> None:
    for name, process in runs.items():
        try:
            code = process.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            code = None
        if (code == 0) == (name in expect_failure):
            tail = (folder / f"{name}.log").read_text(errors="replace")[-4000:]
            raise AssertionError(f"`{name}` ended with {code}:\n{tail}")


def _job(tmp_path_factory: pytest.TempPathFactory, command: str, devices: int) -> Path:
    workspace = run_once(tmp_path_factory, "litgpt_workspace", _workspace)

    def run(folder: Path) -> None:
        folder.mkdir()
        runs = {}
        for hpu in (False, True):
            name = "hpu" if hpu else "cpu"
            args = [command] + ([str(_base_checkpoint(tmp_path_factory))] if command == "finetune_lora" else [])
            args += ["--config", str(workspace / f"{command.split('_')[0]}.yaml"), "--devices", str(devices)]
            args += ["--out_dir", str(folder / name)]
            compiled = "aot_eager" if hpu and command == "pretrain" and devices == 1 else None
            runs[name] = _start(args, folder / f"{name}.log", hpu, compiled)
        if command == "pretrain" and devices == 1:  # LitGPT's torch.compile reaches the HPU's backend
            args = ["pretrain", "--config", str(workspace / "pretrain.yaml"), "--devices", "1"]
            args += ["--out_dir", str(folder / "unknown")]
            runs["unknown_backend"] = _start(args, folder / "unknown_backend.log", True, "no_such_backend")
        _wait(runs, folder, expect_failure=("unknown_backend",))

    return run_once(tmp_path_factory, f"litgpt_{command}_{devices}", run)


def _base_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 1-CPU pretraining's final checkpoint, converted as LitGPT's users convert one for finetuning."""
    pretrained = _job(tmp_path_factory, "pretrain", 1) / "cpu" / "final"

    def convert(folder: Path) -> None:
        from litgpt.scripts.convert_pretrained_checkpoint import convert_pretrained_checkpoint

        convert_pretrained_checkpoint(pretrained, folder)

    return run_once(tmp_path_factory, "litgpt_base", convert)


def _losses(log: Path) -> list[float]:
    return [float(a or b) for a, b in _LOSS.findall(log.read_text(errors="replace"))]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("model", state)


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[name] - b[name]).abs().max().item() for name in a)


def _check_equal(folder: Path, files: tuple[str, ...]) -> None:
    cpu, hpu = _losses(folder / "cpu.log"), _losses(folder / "hpu.log")
    assert len(cpu) >= 4
    assert hpu == cpu
    for file in files:
        assert _max_difference(_weights(folder / "cpu" / file), _weights(folder / "hpu" / file)) <= 1e-6, file


@pytest.mark.parametrize("devices", [1, 2])
def test_pretrain_on_hpus_equals_the_cpu(tmp_path_factory: pytest.TempPathFactory, devices: int) -> None:
    folder = _job(tmp_path_factory, "pretrain", devices)
    _check_equal(folder, ("final/lit_model.pth",))
    log = (folder / "hpu.log").read_text(errors="replace")
    if devices == 2:
        assert "training with FSDPStrategy on HPUFSDPStrategy" in log
    else:  # the compiled run, which also shows it runs on the HPU: the backend comes from the emulator's setting
        error = (folder / "unknown_backend.log").read_text(errors="replace")
        assert f"{COMPILE_BACKEND_ENV}='no_such_backend' is not a torch.compile backend" in error


@pytest.mark.parametrize("devices", [1, 2])
def test_finetune_lora_on_hpus_equals_the_cpu(tmp_path_factory: pytest.TempPathFactory, devices: int) -> None:
    folder = _job(tmp_path_factory, "finetune_lora", devices)
    _check_equal(folder, ("final/lit_model.pth.lora", "final/lit_model.pth"))
    base = _weights(_base_checkpoint(tmp_path_factory) / "lit_model.pth")
    assert _max_difference(_weights(folder / "hpu" / "final" / "lit_model.pth"), base) > 1e-3  # LoRA trained
    if devices == 2:
        assert "training with ModelParallelStrategy on HPUModelParallelStrategy" in (folder / "hpu.log").read_text()
