"""All-reduces per step against ``bucket_cap_mb``: ``hpu_parallel`` hands the cap to DDP, which all-reduces one bucket
per call, packed in the order gradients become ready (formerly a table in ``benchmarks/ddp_knobs.py``)."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from helpers.workload import quiet_trainer
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from lightning_gaudi import HPUParallelStrategy, hpu

#: torch's default cap, and the first bucket's size under it (``dist._DEFAULT_FIRST_BUCKET_BYTES``).
DEFAULT_CAP_MB, FIRST_BUCKET_BYTES = 25, 2**20
WIDTH, LAYERS, STEPS = 256, 6, 4


def expected_buckets(gradient_sizes: list[int], bucket_cap_mb: float | None) -> int:
    """How many buckets DDP makes of gradients of these sizes (bytes, registration order; filled in reverse)."""
    cap = int((DEFAULT_CAP_MB if bucket_cap_mb is None else bucket_cap_mb) * 2**20)
    limits = [FIRST_BUCKET_BYTES if bucket_cap_mb is None else cap, cap]
    buckets, filled = 0, 0
    for size in reversed(gradient_sizes):
        filled += size
        if filled >= limits[min(buckets, 1)]:
            buckets, filled = buckets + 1, 0
    return buckets + (filled > 0)


@pytest.mark.parametrize(
    ("sizes", "cap", "expected"),
    [
        ([100] * 10, 250 / 2**20, 4),  # reversed, closes at >= 250 bytes: 300, 300, 300, 100
        ([2**20] * 3, 2.0, 2),  # 2 MiB then 1 MiB
        ([2**20, 3 * 2**20], 1.0, 2),  # a gradient larger than the cap gets its own bucket
        ([512 * 1024] * 4, None, 2),  # torch's default: a first bucket of 1 MiB, then 25 MB
    ],
)
def test_expected_bucket_count(sizes: list[int], cap: float | None, expected: int) -> None:
    assert expected_buckets(sizes, cap) == expected


class _Deep(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(*(nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)))

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        return self.net(batch).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("bucket_cap_mb", [0.25, 0.5, 1.0, None])
def test_all_reduces_per_step_follow_bucket_cap_mb(
    isolated_env: pytest.MonkeyPatch, bucket_cap_mb: float | None
) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")  # the launch exports WORLD_SIZE and the rest: restored after
    calls: list[int] = []

    def counting(state, bucket):  # type: ignore[no-untyped-def]  # torch checks the annotations, as objects
        calls.append(bucket.index())
        return allreduce_hook(state, bucket)

    knobs = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    strategy = HPUParallelStrategy(ddp_comm_hook=counting, **knobs)
    model = _Deep()
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    trainer = quiet_trainer(max_steps=STEPS, strategy=strategy, devices=1)
    try:
        trainer.fit(model, torch.utils.data.DataLoader(torch.randn(STEPS * 2, WIDTH), batch_size=2))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    steps = [i for i, index in enumerate(calls) if index == 0] + [len(calls)]  # each step starts with bucket 0
    per_step = [end - start for start, end in itertools.pairwise(steps)]
    assert len(per_step) == STEPS
    # the first step runs on DDP's initial buckets; they are rebuilt in the order the gradients became ready
    assert per_step[1:] == [expected_buckets(sizes, bucket_cap_mb)] * (STEPS - 1)
