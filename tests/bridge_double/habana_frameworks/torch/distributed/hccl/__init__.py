"""Test double of ``habana_frameworks.torch.distributed.hccl``.

Importing it registers an ``"hccl"`` process-group backend with ``torch.distributed``, as the bridge does; in the
double that backend is the emulator's (gloo behind HCCL's reduce ops, dtypes and float32 reductions), so
``init_process_group(backend="hccl")`` really runs on the CPU and refuses what HCCL refuses.
"""

import os

import _bridge_double_state as _state
import torch.distributed as dist

from lightning_gaudi.hpu.hccl import EmulatedHCCLGroup

_state.record("import hccl")


if not hasattr(dist.Backend, "HCCL"):  # torch keeps registrations for the life of the process
    dist.Backend.register_backend("hccl", EmulatedHCCLGroup, devices=["cpu", "hpu"])


def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    """As bridge 1.19: exports the three when all are given, else defaults ``MASTER_ADDR``/``MASTER_PORT``; returns
    them as read back from the environment (rank and local rank -1 when unset). Open MPI's variables and the card
    selection (``HLS_MODULE_ID``) are left out."""
    _state.record("hccl.initialize_distributed_hpu", world_size=world_size, rank=rank, local_rank=local_rank)
    if world_size is not None and rank is not None and local_rank is not None:
        os.environ.update(WORLD_SIZE=str(world_size), RANK=str(rank), LOCAL_RANK=str(local_rank))
    else:
        os.environ.setdefault("MASTER_ADDR", "localhost")
        os.environ.setdefault("MASTER_PORT", "12345")
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    return world_size, rank, local_rank
