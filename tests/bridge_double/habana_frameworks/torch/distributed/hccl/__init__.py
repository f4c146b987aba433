"""Test double of ``habana_frameworks.torch.distributed.hccl`` (bridge 1.19:
``python_packages/habana_frameworks/torch/distributed/hccl/__init__.py``, lines cited below as ``hccl:N``).

Importing it does what importing the bridge's module does, in the same order:

1. ``hccl:11`` ``int(os.environ.get("PT_HPU_LAZY_MODE", "1"))``: any value but an integer (``false``, ``""``) fails
   the import with ``ValueError``; ``hccl:12`` reads ``PT_HPU_ENABLE_LAZY_COLLECTIVES`` (the C extension it picks,
   ``hccl:13-21``, has no double);
2. ``hccl:24`` ``distributed_emulation_apply_if_enabled()`` (Intel's ``PT_HPU_EMULATE_DISTRIBUTED``);
3. ``hccl:113`` ``initialize_distributed_hpu()`` with no arguments: Open MPI's ``OMPI_COMM_WORLD_*`` copied to
   ``LOCAL_RANK``/``WORLD_SIZE``/``RANK`` unless those three are all set, ``MASTER_ADDR=localhost`` and
   ``MASTER_PORT=12345`` where unset, ``HLS_MODULE_ID`` (the card, through ``HABANA_VISIBLE_MODULES``) where a local
   rank and a world size above 1 are known, ``ID`` = the rank where known;
4. ``hccl:120`` registers the ``"hccl"`` process-group backend. In the double that backend is the emulator's
   (:class:`lightning_gaudi.emulator.hccl_group.EmulatedHCCLGroup`: gloo behind HCCL's reduce ops, dtypes and float32
   reductions), so ``init_process_group(backend="hccl")`` really runs on the CPU and refuses what HCCL refuses; it is
   registered for ``cpu`` too (tensors stay on the CPU in the double), where the bridge names ``hpu`` only.

Not copied: ``hccl:165`` ``_disallow_collectives_in_graph()`` (it would change what dynamo captures in every later
test of the process). The import-time call to ``initialize_distributed_hpu`` is logged as ``"import hccl"`` only, so a
test's ``called("hccl.initialize_distributed_hpu")`` lists the calls the plugin made.
"""

import os

import _bridge_double_state as _state
import torch.distributed as dist

from habana_frameworks.torch.hpu import HABANA_VISIBLE_MODULES_VAR, HLS_MODULE_ID_VAR
from habana_frameworks.torch.utils.experimental.distributed_emulation import (
    distributed_emulation_apply_if_enabled,
    is_distributed_emulation_enabled,
)
from lightning_gaudi.emulator.hccl_group import EmulatedHCCLGroup

_state.record("import hccl")

_lazy_mode = int(os.environ.get("PT_HPU_LAZY_MODE", "1"))
_lazy_collectives_enabled = os.environ.get("PT_HPU_ENABLE_LAZY_COLLECTIVES", "False").lower() in ["true", "1"]

distributed_emulation_apply_if_enabled()


def _setup_module_id(local_rank=-1, world_size=1):
    if HLS_MODULE_ID_VAR in os.environ:
        return
    if local_rank == -1 or world_size == 1 or is_distributed_emulation_enabled():
        return
    if HABANA_VISIBLE_MODULES_VAR in os.environ:
        visible_modules = os.environ[HABANA_VISIBLE_MODULES_VAR].split(",")
        assert local_rank < len(visible_modules), f"""There is not enough devices
        available for training. Please verify if {HABANA_VISIBLE_MODULES_VAR}
        is set correctly."""
        os.environ[HLS_MODULE_ID_VAR] = visible_modules[local_rank]
        return
    os.environ[HLS_MODULE_ID_VAR] = str(local_rank)


def _setup_user_overrides(world_size=None, rank=None, local_rank=None):
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["RANK"] = str(rank)
    os.environ["LOCAL_RANK"] = str(local_rank)


def _setup_environment_from_mpi():
    mapping = {
        "OMPI_COMM_WORLD_LOCAL_RANK": "LOCAL_RANK",
        "OMPI_COMM_WORLD_SIZE": "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK": "RANK",
    }
    if all(key in os.environ for key in mapping.values()):
        return  # hccl:67-69: the rank variables are all set, and so MASTER_ADDR/MASTER_PORT are left alone too
    if all(key in os.environ for key in mapping):
        for mpi_name, name in mapping.items():
            os.environ[name] = os.environ[mpi_name]
    if os.getenv("MASTER_ADDR") is None:
        os.environ["MASTER_ADDR"] = "localhost"
    if os.getenv("MASTER_PORT") is None:
        os.environ["MASTER_PORT"] = "12345"


def _read_values_from_env():
    world_size = int(os.getenv("WORLD_SIZE", 1))
    rank = int(os.getenv("RANK", -1))
    local_rank = int(os.environ.get("LOCAL_RANK", -1))
    return world_size, rank, local_rank


def _initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    if all(v is not None for v in [world_size, rank, local_rank]):
        _setup_user_overrides(world_size, rank, local_rank)
    else:
        _setup_environment_from_mpi()
    world_size, rank, local_rank = _read_values_from_env()
    _setup_module_id(local_rank=local_rank, world_size=world_size)
    if rank != -1:
        os.environ["ID"] = str(rank)
    return world_size, rank, local_rank


def initialize_distributed_hpu(world_size=None, rank=None, local_rank=None):
    """As bridge 1.19 (``hccl:91-110``): exports the three when all are given, else maps Open MPI's variables and
    defaults ``MASTER_ADDR``/``MASTER_PORT``; sets ``HLS_MODULE_ID`` and ``ID``; returns the three as read back from
    the environment (rank and local rank -1 when unset)."""
    _state.record("hccl.initialize_distributed_hpu", world_size=world_size, rank=rank, local_rank=local_rank)
    return _initialize_distributed_hpu(world_size, rank, local_rank)


_initialize_distributed_hpu()  # hccl:113


if not hasattr(dist.Backend, "HCCL"):  # torch keeps registrations for the life of the process
    dist.Backend.register_backend("hccl", EmulatedHCCLGroup, devices=["cpu", "hpu"])
