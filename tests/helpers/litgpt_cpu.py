"""``litgpt ARGS`` on the CPU with stock Lightning, the reference the HPU runs are compared with.

It is the ``litgpt`` command itself, with one change: on several devices ``litgpt pretrain`` builds Lightning's
``FSDPStrategy``, which Fabric refuses off GPUs by its exact class (``type(strategy) is FSDPStrategy``) although FSDP
runs on the CPU over gloo. ``litgpt pretrain`` gets a subclass that adds nothing, so the check passes and the run is
stock FSDP on CPUs. Lightning's launcher starts the other ranks with this file's command line again.
"""

from __future__ import annotations

import litgpt.pretrain
import torch
from lightning.fabric.strategies import FSDPStrategy
from litgpt.__main__ import main
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.nn import Module


class CPUFSDPStrategy(FSDPStrategy):
    """Lightning's ``FSDPStrategy`` with FSDP told its device, the CPU (Lightning passes the CUDA index: none on the
    CPU, where FSDP refuses a model built on the meta device); Lightning's ``setup_module`` does the rest."""

    def setup_module(self, module: Module) -> Module:
        kwargs = {key: value for key, value in self._fsdp_kwargs.items() if key != "auto_wrap_policy"}
        wrapped = FullyShardedDataParallel(
            module,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=torch.device("cpu"),
            **self._fsdp_kwargs,
        )
        saved, self._fsdp_kwargs = self._fsdp_kwargs, kwargs  # the policy is applied: Lightning would warn about it
        try:
            return super().setup_module(wrapped)
        finally:
            self._fsdp_kwargs = saved


litgpt.pretrain.FSDPStrategy = CPUFSDPStrategy

if __name__ == "__main__":
    main()
