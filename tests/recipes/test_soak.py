"""The soak (``benchmarks/soak.py``) in short: a 2-card DDP job saving a checkpoint every few steps keeps its open
file descriptors and threads flat and its resident memory within a few MiB after the warm-up; the full run per
strategy family is in ``benchmarks/results/soak.md``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import soak  # noqa: E402


@pytest.mark.subprocess
def test_a_short_ddp_soak_keeps_descriptors_threads_and_memory_flat(tmp_path: Path) -> None:
    result = soak.soak("ddp", duration=6, every=5, out=tmp_path)
    assert result["steps"] > 20
    for rank, facts in enumerate(result["ranks"]):
        assert facts["samples"] >= 4, facts
        assert facts["fds"][0] == facts["fds"][1], f"rank {rank} leaked file descriptors: {facts}"
        assert facts["threads"][0] == facts["threads"][1], f"rank {rank} leaked threads: {facts}"
        assert facts["rss_mib"][1] - facts["rss_mib"][0] < 32, f"rank {rank}'s memory grew: {facts}"
    names = sorted(p.name for p in (tmp_path / "ddp").iterdir())
    assert len(names) == 2, names  # last.ckpt and the newest step checkpoint; no temporary left
    assert "last.ckpt" in names, names
