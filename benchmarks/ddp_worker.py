"""One launch of ``hpu_parallel`` (or ``hpu_single``) fits, for the DDP-knobs and scaling benchmarks.

``python -m benchmarks.ddp_worker SPEC.json OUT_DIR``: SPEC holds ``devices`` and a list of ``trials``, fitted one
after the other in the same processes (Lightning's popen launcher re-runs this command for rank 1). Each rank writes
``OUT_DIR/rank<r>.json``: per trial, steps/s after warm-up, all-reduce calls per step (counted by a DDP comm hook),
the bucket layout and the peak resident memory of the process.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import sys
import tempfile
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from benchmarks.common import BenchModel, StepTimer, Workload, make_loader, parameter_count, quiet, trainer_kwargs


class WideMLP(LightningModule):
    """``layers`` square linear layers with ReLU (``width=2048, layers=24``: 100.7M parameters); plain SGD."""

    def __init__(self, width: int, layers: int) -> None:
        super().__init__()
        self.net = nn.Sequential(*(m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())))

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        loss = ((self.net(x).mean(dim=1, keepdim=True) - y) ** 2).mean()
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=1e-4)


def wide_loader(width: int, batch: int, steps: int) -> torch.utils.data.DataLoader:
    x = torch.randn(steps * batch, width, generator=torch.Generator().manual_seed(0))
    dataset = torch.utils.data.TensorDataset(x, x.mean(dim=1, keepdim=True))
    return torch.utils.data.DataLoader(dataset, batch_size=batch, drop_last=True)


class AllReduceCounter:
    """Counts the buckets DDP all-reduces; :attr:`hook` is the comm hook (it then all-reduces as DDP's default)."""

    def __init__(self) -> None:
        self.calls = 0
        self.bucket_bytes: list[int] = []

        def all_reduce_counter(state, bucket):  # type: ignore[no-untyped-def]  # DDP rejects other annotations
            self.calls += 1
            buffer = bucket.buffer()
            self.bucket_bytes.append(buffer.numel() * buffer.element_size())
            return allreduce_hook(state, bucket)

        self.hook = all_reduce_counter


class DDPProbe(Callback):
    """Makes sure the comm hook is on the DDP model and records the calls per step over the timed window."""

    def __init__(self, counter: AllReduceCounter, warmup: int) -> None:
        self.counter = counter
        self.warmup = warmup
        self.registered_by = "strategy"
        self.at_warmup = 0
        self.layout: list[int] = []
        self.ddp: dict[str, Any] = {}
        self.rss_at_fit_start = 0
        self.rss_after_backward: list[int] = []
        self.in_use_after_backward: list[int] = []
        self.device_in_use_after_backward: list[int] = []

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        ddp = trainer.strategy.model
        if not isinstance(ddp, DistributedDataParallel):
            self.registered_by = "none (not DDP)"
            return
        self.rss_at_fit_start = _rss()
        self.ddp = {
            "bucket_bytes_cap": ddp.bucket_bytes_cap,
            "gradient_as_bucket_view": ddp.gradient_as_bucket_view,
            "static_graph": ddp.static_graph,
        }
        if not getattr(ddp, "_comm_hooks", None):
            # HPUParallelStrategy inherits DDPStrategy._register_ddp_hooks, which registers ddp_comm_hook on CUDA only
            ddp.register_comm_hook(None, self.counter.hook)
            self.registered_by = "callback (the strategy did not register ddp_comm_hook)"

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        if batch_idx == self.warmup:
            self.at_warmup = self.counter.calls
            self.counter.bucket_bytes.clear()

    def on_before_optimizer_step(self, trainer: Trainer, pl_module: LightningModule, optimizer: Any) -> None:
        self.rss_after_backward.append(_rss())
        from lightning_gaudi import hpu

        self.device_in_use_after_backward.append(hpu.get_backend().memory_stats()["InUse"])
        in_use = _malloc_in_use()
        if in_use is not None:
            self.in_use_after_backward.append(in_use)
        if not self.layout and trainer.global_step >= self.warmup:
            self.layout = list(self.counter.bucket_bytes)


def _trial(spec: dict[str, Any], devices: int) -> dict[str, Any]:
    from lightning_gaudi import HPUParallelStrategy

    seed_everything(0, verbose=False)
    steps, warmup = spec["steps"], spec["warmup"]
    if spec.get("wide"):
        model: LightningModule = WideMLP(**spec["wide"])
        loader = wide_loader(spec["wide"]["width"], spec["batch"], steps * devices)
    else:
        workload = Workload(**spec["workload"])
        model = BenchModel(workload)
        loader = make_loader(workload, steps * devices)  # the distributed sampler gives each rank 1/devices
    counter = AllReduceCounter()
    timer = StepTimer(warmup, steps - 1)
    callbacks: list[Callback] = [timer]
    if devices > 1:
        knobs = spec.get("knobs", {})
        strategy: Any = HPUParallelStrategy(ddp_comm_hook=counter.hook, **knobs)
        probe = DDPProbe(counter, warmup)
        callbacks.append(probe)
    else:
        strategy = "hpu_single"
    rss_before = _rss()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            **trainer_kwargs(
                steps, accelerator="hpu", devices=devices, strategy=strategy, callbacks=callbacks, default_root_dir=tmp
            )
        )
        with quiet():
            trainer.fit(model, loader)
    result: dict[str, Any] = {
        "name": spec["name"],
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "parameters": parameter_count(model),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "steps_per_s": timer.steps_per_second(),
        "samples_per_s": timer.steps_per_second() * spec["batch"] * trainer.world_size,
        "cpu_utilization": timer.cpu_utilization(),
        "rss_before_fit_bytes": rss_before,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }
    if devices > 1:
        timed = timer.steps
        result.update(
            knobs=spec.get("knobs", {}),
            ddp=probe.ddp,
            comm_hook_registered_by=probe.registered_by,
            rss_at_fit_start_bytes=probe.rss_at_fit_start,
            rss_after_backward_bytes=probe.rss_after_backward,
            malloc_in_use_after_backward_bytes=probe.in_use_after_backward,
            device_in_use_after_backward_bytes=probe.device_in_use_after_backward,
            allreduce_calls_per_step=(counter.calls - probe.at_warmup) / timed if timed else None,
            bucket_layout_bytes=probe.layout,
            gradient_sizes_bytes=[p.numel() * p.element_size() for p in model.parameters()],
        )
    return result


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _malloc_in_use() -> int | None:
    """Bytes glibc's allocator has handed out and not taken back (heap in use plus mmapped chunks), if glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return int(info.uordblks + info.hblkhd)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(spec.get("threads", 1))
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    import lightning_gaudi  # noqa: F401 - registers "hpu"

    results = [_trial(trial, spec["devices"]) for trial in spec["trials"]]
    rank = results[0]["rank"] if results else 0
    (out / f"rank{rank}.json").write_text(json.dumps(results))


if __name__ == "__main__":
    main()
