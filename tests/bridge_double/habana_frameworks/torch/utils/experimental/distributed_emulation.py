"""Test double of ``habana_frameworks.torch.utils.experimental.distributed_emulation`` (bridge 1.19,
``python_packages/habana_frameworks/torch/utils/experimental/distributed_emulation.py``): Intel's single-card emulation
of a multi-rank job, which the distributed module applies when it is imported. Copied as the source has it."""

import os
import sys
from functools import partial


def _distributed_emulation_patch_store_barrier():
    import torch.distributed.distributed_c10d

    def store_based_barrier_dummy(rank, store, timeout):
        pass

    torch.distributed.distributed_c10d._store_based_barrier = store_based_barrier_dummy

    import torch.distributed.rendezvous
    from torch.distributed import TCPStore as TCPStore_orig

    sys.modules["torch.distributed.rendezvous"].TCPStore = partial(TCPStore_orig, wait_for_workers=False)


def is_distributed_emulation_enabled():
    return os.environ.get("PT_HPU_EMULATE_DISTRIBUTED", "False").lower() in ["true", "1"]


def distributed_emulation_apply_if_enabled():
    single_rank = os.environ.get("PT_HPU_EMULATE_DISTRIBUTED_SINGLE_RANK", None)
    if single_rank:
        single_rank = int(single_rank)
    if is_distributed_emulation_enabled() and single_rank is not None:
        _distributed_emulation_patch_store_barrier()
        try:
            rank = int(os.environ["RANK"])
        except KeyError:
            print("In order to use distributed emulation the 'RANK' env var has to be set to worker rank")
            raise
        if single_rank != rank:
            print(f"Single rank emulation mode, rank {rank} terminating")
            sys.exit(0)
