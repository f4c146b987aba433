"""One launch of a 2-process fit under one strategy, for the sharded-memory benchmark (:mod:`benchmarks.sharded`).

``python -m benchmarks.sharded_worker SPEC.json OUT_DIR``: SPEC names the strategy, its arguments, the model and
the steps. Lightning's popen launcher re-runs the command for the other rank. Each rank writes
``OUT_DIR/rank<r>.json``: the bytes of parameters and optimizer state the rank holds between steps (each tensor
storage counted once, at its local size: a shard where the strategy shards), glibc's bytes in use at the same point,
the process's peak resident memory and the steps/s after warm-up. SPEC's ``strategy_kwargs`` may name a ``plan``
for ``hpu_model_parallel`` (:class:`WideMLPParallel`): ``fsdp2`` or ``tp``.
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
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor, nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from benchmarks.common import StepTimer, quiet, trainer_kwargs


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


class WideMLPAdamW(WideMLP):
    """:class:`WideMLP` trained with AdamW: two moments per parameter, the state sharding
    is for."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-4)


class WideMLPParallel(WideMLPAdamW):
    """:class:`WideMLPAdamW` for ``hpu_model_parallel``: in ``configure_model``, ``plan="fsdp2"`` applies
    ``fully_shard`` to each Linear, then to the root, over the mesh's data-parallel dimension; ``plan="tp"`` splits the
    Linears alternately column-wise and row-wise (Megatron pairs: the ReLU between them runs on each card's slice, the
    row-wise layer's partial outputs are all-reduced) over its tensor-parallel dimension."""

    def __init__(self, width: int, layers: int, plan: str) -> None:
        super().__init__(width, layers)
        if plan not in ("fsdp2", "tp"):
            raise ValueError(f"plan={plan!r}: choose 'fsdp2' or 'tp'")
        self.plan = plan

    def configure_model(self) -> None:
        linears = [name for name, module in self.net.named_children() if isinstance(module, nn.Linear)]
        if isinstance(getattr(self.net, linears[0]).weight, DTensor):
            return  # already applied
        mesh = self.device_mesh
        if self.plan == "tp":
            styles = (ColwiseParallel, RowwiseParallel)
            plan = {name: styles[i % 2]() for i, name in enumerate(linears)}
            parallelize_module(self.net, mesh["tensor_parallel"], plan)
        else:
            for name in linears:
                fully_shard(getattr(self.net, name), mesh=mesh["data_parallel"])
            fully_shard(self, mesh=mesh["data_parallel"])


def _local(tensor: Tensor) -> Tensor:
    # ZeRO-3 keeps a parameter's local partition in ``ds_tensor`` and leaves the parameter itself empty
    partition = getattr(tensor, "ds_tensor", None)
    if isinstance(partition, Tensor):
        return partition
    # FSDP2 and tensor parallelism: a DTensor's local shard (FSDP2's is a view into its padded shard storage)
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind ``tensors`` (non-tensors ignored), each counted once."""
    sizes: dict[int, int] = {}
    for tensor in tensors:
        if not isinstance(tensor, Tensor):
            continue
        storage = _local(tensor).untyped_storage()
        if storage.nbytes():
            sizes[storage.data_ptr()] = max(sizes.get(storage.data_ptr(), 0), storage.nbytes())
    return sum(sizes.values())


def held_state(trainer: Trainer) -> dict[str, int]:
    """Parameter and optimizer-state bytes this rank holds: the wrapped model's parameters, the optimizers' parameters
    (master copies where the strategy keeps them) and every tensor in the optimizers' state."""
    model = trainer.strategy.model
    assert model is not None
    params = list(model.parameters())
    optimizer_tensors: list[Any] = []
    for optimizer in trainer.optimizers:
        optimizer_tensors += [p for group in optimizer.param_groups for p in group["params"]]
        optimizer_tensors += [value for state in optimizer.state.values() for value in state.values()]
    param_bytes = storage_bytes(params)
    total = storage_bytes([*params, *optimizer_tensors])
    return {"parameter_bytes": param_bytes, "optimizer_bytes": total - param_bytes, "state_bytes": total}


class StateProbe(Callback):
    """Records :func:`held_state` and glibc's bytes in use after each optimizer step past warm-up (maxima)."""

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.state: dict[str, int] = {}
        self.in_use = 0

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if batch_idx < self.warmup:
            return
        for key, value in held_state(trainer).items():
            self.state[key] = max(self.state.get(key, 0), value)
        self.in_use = max(self.in_use, _malloc_in_use() or 0)


def _strategy(spec: dict[str, Any]) -> Any:
    kwargs = dict(spec.get("strategy_kwargs", {}))
    kwargs.pop("plan", None)  # the model's, not the strategy's
    if kwargs.pop("wrap_linear", False):
        kwargs["auto_wrap_policy"] = {nn.Linear}
    if not kwargs:
        return spec["strategy"]
    from lightning.pytorch.strategies import StrategyRegistry

    entry = StrategyRegistry[spec["strategy"]]
    return entry["strategy"](**{**entry["init_params"], **kwargs})


def fit(spec: dict[str, Any]) -> dict[str, Any]:
    """Fits :class:`WideMLPAdamW` for ``spec["steps"]`` steps under ``spec["strategy"]``; returns this rank's
    figures."""
    seed_everything(0, verbose=False)
    width, layers, batch, steps, warmup = (spec[k] for k in ("width", "layers", "batch", "steps", "warmup"))
    plan = spec.get("strategy_kwargs", {}).get("plan")
    model = WideMLPAdamW(width, layers) if plan is None else WideMLPParallel(width, layers, plan)
    parameters = sum(p.numel() for p in model.parameters())
    timer = StepTimer(warmup, steps - 1)
    probe = StateProbe(warmup)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            **trainer_kwargs(
                steps,
                accelerator="hpu",
                devices=spec["devices"],
                strategy=_strategy(spec),
                callbacks=[timer, probe],
                default_root_dir=tmp,
                use_distributed_sampler=False,
            )
        )
        with quiet():
            trainer.fit(model, wide_loader(width, batch, steps))
    return {
        "name": spec["name"],
        "strategy": spec["strategy"],
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "parameters": parameters,
        **probe.state,
        "malloc_in_use_bytes": probe.in_use,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "steps_per_s": timer.steps_per_second(),
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    torch.set_num_threads(spec.get("threads", 1))
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore")
    os.environ.setdefault("LIGHTNING_GAUDI_EMULATE", "eager")
    import lightning_gaudi  # noqa: F401 - registers "hpu" and the strategies

    result = fit(spec)
    (out / f"rank{result['rank']}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
