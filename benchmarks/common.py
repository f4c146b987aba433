"""What every measurement shares: the workload, the step timer, the machine record, the statistics, and the launch of
fresh worker processes in rotating order."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

EMULATE_ENV = "LIGHTNING_GAUDI_EMULATE"


@dataclass(frozen=True)
class Workload:
    """The shape of the benchmark model and its data.

    Attributes:
        d_model: width of the transformer block.
        heads: attention heads.
        blocks: transformer blocks before the MLP head.
        seq: tokens per sample.
        batch: samples per step (per process).
    """

    d_model: int = 64
    heads: int = 4
    blocks: int = 1
    seq: int = 32
    batch: int = 32

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class Block(nn.Module):
    """A pre-norm transformer block: causal self-attention and a 4x MLP, each with a residual.

    Attention is written out (softmax of scaled scores under a fixed causal mask), the same arithmetic for every
    variant, with separate query, key and value projections: with torch 2.13, Lazy Tensor Core returns CPU tensors
    from matmuls (and ``scaled_dot_product_attention``) of ``split``/``unbind`` views of one fused projection.
    """

    def __init__(self, d_model: int, heads: int, seq: int) -> None:
        super().__init__()
        self.heads = heads
        self.scale = (d_model // heads) ** -0.5
        self.register_buffer("future", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        self.norm1 = nn.LayerNorm(d_model)
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        h = self.norm1(x)
        q, k, v = (
            proj(h).view(b, t, self.heads, d // self.heads).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        scores = (q @ k.transpose(-2, -1) * self.scale).masked_fill(self.future, float("-inf"))
        attention = F.softmax(scores, dim=-1) @ v
        x = x + self.proj(attention.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class BenchModel(LightningModule):
    """Transformer blocks and an MLP head regressing one number per sequence; AdamW; loss to the progress bar.

    The loss is written out (no ``mse_loss``) so that Lazy Tensor Core runs it without a CPU fallback.
    """

    def __init__(self, workload: Workload, lr: float = 1e-3) -> None:
        super().__init__()
        d = workload.d_model
        self.blocks = nn.Sequential(*(Block(d, workload.heads, workload.seq) for _ in range(workload.blocks)))
        self.head = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, 1))
        self.lr = lr

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.blocks(x).mean(dim=1))

    def loss(self, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return ((self(x) - y) ** 2).mean()

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = self.loss(batch)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def make_loader(workload: Workload, steps: int, seed: int = 0) -> DataLoader:
    """``steps`` full batches of random sequences, fixed shapes, not shuffled."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * workload.batch, workload.seq, workload.d_model, generator=generator)
    y = x.mean(dim=(1, 2)).unsqueeze(1)
    return DataLoader(TensorDataset(x, y), batch_size=workload.batch, shuffle=False, drop_last=True)


class StepTimer(Callback):
    """Times training batches ``warmup`` to ``last``: from that batch's start to the last one's end.

    Records wall-clock time and this process's CPU time (``time.process_time``, all its threads). In lazy mode the
    clocks stop after the device has finished (one synchronize at each end of the window).
    """

    def __init__(self, warmup: int, last: int, synchronize: Any = None) -> None:
        self.warmup = warmup
        self.last = last
        self.synchronize = synchronize
        self.start: tuple[float, float] | None = None
        self.end: tuple[float, float] | None = None

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            if self.synchronize is not None:
                self.synchronize()
            self.start = (time.perf_counter(), time.process_time())

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx == self.last:
            if self.synchronize is not None:
                self.synchronize()
            self.end = (time.perf_counter(), time.process_time())

    @property
    def steps(self) -> int:
        return self.last - self.warmup + 1

    def _elapsed(self, clock: int) -> float:
        if self.start is None or self.end is None:
            raise RuntimeError(f"the timed window (batches {self.warmup} to {self.last}) never closed")
        return self.end[clock] - self.start[clock]

    def steps_per_second(self) -> float:
        """Steps per wall-clock second over the window."""
        return self.steps / self._elapsed(0)

    def steps_per_cpu_second(self) -> float:
        """Steps per second of this process's CPU time over the window: what the loop costs."""
        return self.steps / self._elapsed(1)

    def cpu_utilization(self) -> float:
        """CPU time over wall time in the window: 1.0 is one core busy all the time (one torch thread)."""
        return self._elapsed(1) / self._elapsed(0)


def summarize(values: list[float]) -> dict[str, Any]:
    """Median, min, max and the spread ((max - min) / median) of repeated measurements."""
    if not values:
        raise ValueError("no measurements to summarize")
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread": (max(values) - min(values)) / median if median else math.nan,
        "values": values,
    }


def ratio_summary(numerators: list[float], denominators: list[float]) -> dict[str, Any]:
    """Per-repetition ratios (A/B from the same alternation round), summarized."""
    return summarize([a / b for a, b in zip(numerators, denominators, strict=True)])


def machine() -> dict[str, Any]:
    """The facts that go beside every figure: cores, CPU, torch, Lightning, Python, emulation."""
    import lightning

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = math.nan
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu": cpu,
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1min": load,
    }


@contextlib.contextmanager
def emulation(mode: str | None) -> Iterator[None]:
    """Sets ``LIGHTNING_GAUDI_EMULATE`` for the block (``None``: the real bridge) and restores it after."""
    before = os.environ.get(EMULATE_ENV)
    if mode is None:
        os.environ.pop(EMULATE_ENV, None)
    else:
        os.environ[EMULATE_ENV] = mode
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(EMULATE_ENV, None)
        else:
            os.environ[EMULATE_ENV] = before


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Sends the progress bar (and anything else on stderr/stdout) to /dev/null for the block.

    The bar still renders and reads its metrics as it would on a terminal; only the text is thrown away.
    """
    with open(os.devnull, "w") as sink, contextlib.redirect_stderr(sink), contextlib.redirect_stdout(sink):
        yield


def trainer_kwargs(steps: int, **overrides: Any) -> dict[str, Any]:
    """One epoch of ``steps`` training batches with the progress bar on, and nothing else that writes files."""
    kwargs: dict[str, Any] = {
        "devices": 1,
        "max_epochs": 1,
        "max_steps": steps,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": True,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
    }
    kwargs.update(overrides)
    return kwargs


def log(message: str) -> None:
    print(message, file=sys.__stderr__, flush=True)


#: Gaudi default callbacks (``conf/callbacks/default.yaml``) left out of the benchmarks: they need a validation
#: metric (``model_checkpoint``) or are not about the device (``lr_monitor``), and would cost the same under stock
#: Lightning.
NOT_BENCHMARKED = ("model_checkpoint", "lr_monitor")


def gaudi_callbacks() -> tuple[list[str], list[Callback]]:
    """The Gaudi default callback set, composed from ``conf/callbacks/default.yaml`` with Hydra as the app does.

    Returns the config names used and the instantiated callbacks (without :data:`NOT_BENCHMARKED`).
    """
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    import lightning_gaudi.app.hydra  # noqa: F401 - registers the callback schemas the recipes extend

    conf = Path(__file__).resolve().parent.parent / "conf"
    with initialize_config_dir(str(conf), version_base=None):
        cfg = compose("train")
    names = [name for name in cfg.callbacks if name not in NOT_BENCHMARKED]
    return names, [instantiate(cfg.callbacks[name]) for name in names]


# ---------------------------------------------------------------- alternation and fresh processes


def rotation(variants: Sequence[str], index: int) -> list[str]:
    """The order of the variants in round ``index``: rotated by one each round, so none always runs first."""
    shift = index % len(variants)
    return [*variants[shift:], *variants[:shift]]


def fmt_summary(summary: dict[str, Any], fmt: str = ".1f") -> str:
    """``median (min-max)`` of a :func:`summarize` result."""
    return f"{summary['median']:{fmt}} ({summary['min']:{fmt}}-{summary['max']:{fmt}})"


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a fresh benchmark process: no plugin, launcher or SLURM settings inherited,
    one OpenMP thread, warnings off; then ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "MASTER_", "SLURM_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    env.update(extra)
    return env


def run_worker(module: str, args: Sequence[str], result: Path, env: dict[str, str], timeout: float = 600) -> Any:
    """Runs ``python -m MODULE --worker ARGS...`` (Lightning's popen launcher re-runs the same command for rank 1)
    and returns the JSON its rank 0 wrote to ``result`` (then removed).

    A process that aborts at exit after writing its result still counts; one that wrote nothing raises with the end
    of its stderr.
    """
    result.unlink(missing_ok=True)
    command = [sys.executable, "-m", module, "--worker", *args]
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    if not result.exists():
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    value = json.loads(result.read_text())
    result.unlink()
    return value


def machine_line(facts: dict[str, Any]) -> str:
    """The machine in one line, for the head of a results table."""
    return (
        f"{facts['cpu']}, {facts['usable_cores']} cores, {facts['torch_threads']} torch thread(s) per process,"
        f" torch {facts['torch']}, Lightning {facts['lightning']}, Python {facts['python']},"
        f" load {facts['load_average_1min']:.1f} at start"
    )
