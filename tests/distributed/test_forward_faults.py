"""DDP's own collectives in the forward (buffer broadcast, bucket rebuild) fail as the strategy's collective errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_gaudi import hpu

HELPER = Path(__file__).parents[1] / "reliability_helpers" / "forward_peer_lost.py"


@pytest.mark.subprocess
def test_a_peer_lost_in_ddps_forward_is_a_peer_lost_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK"):
        env.pop(name, None)
    env.update({hpu.EMULATE_ENV: "eager", "OMP_NUM_THREADS": "1"})
    proc = subprocess.run(
        [sys.executable, str(HELPER)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0
    assert "lightning_gaudi.distributed.errors.PeerLostError: Rank 0/2: forward (DDP bucket rebuild or buffer" in (
        proc.stderr
    ), proc.stderr[-4000:]
    assert "timeout=0:00:30" in proc.stderr
