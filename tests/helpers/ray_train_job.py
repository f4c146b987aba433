"""Ray Train's documented Lightning pattern on a local 2-worker Ray cluster, for tests/integration/test_ray_train.py.

Run as ``python ray_train_job.py OUT_DIR RAY_TEMP``. Starts a Ray cluster of its own (2 CPUs, no dashboard, its
temporary folder ``RAY_TEMP``), runs two ``TorchTrainer`` jobs of 2 workers and stops the cluster:

1. ``cases``: in each worker, the same seeded model trained on the same data by every case below, one after the other
   in the same Ray process group; rank 0 writes each case's final weights to ``OUT_DIR/<case>.pt``:
   - ``ddp_cpu`` / ``ddp_hpu``: ``RayDDPStrategy()``, ``RayLightningEnvironment()``, ``RayTrainReportCallback()``,
     ``prepare_trainer``, ``devices="auto"``, on ``accelerator="cpu"`` and ``"hpu"`` (both report a checkpoint per
     epoch to Ray);
   - ``fsdp_hpu``: the same with ``RayFSDPStrategy()`` (stock FSDP refuses the CPU: torch's FSDP needs an accelerator
     device, so its control is ``ddp_cpu``);
   - ``hpu_parallel``: ``strategy="hpu_parallel"`` by name with ``RayLightningEnvironment()``, no ``prepare_trainer``;
   - ``deepspeed_hpu`` (where DeepSpeed is installed): ``RayDeepSpeedStrategy(stage=2)`` (stock DeepSpeed refuses the
     CPU: its control is ``ddp_cpu``);
   - ``fabric_cpu`` / ``fabric_hpu``: a Fabric loop with ``strategy="ddp"`` and ``RayLightningEnvironment()``;
   - ``resumed``: ``ddp_hpu`` again from the checkpoint Ray kept after its first epoch, found among the run's reported
     checkpoints (``ray.train.get_all_reported_checkpoints()``, what the controller persisted), as a restarted job
     passes one in (in the same workers: a job of its own cost another Ray worker group, about 30 s on 2 cores).
   Each worker sees only its own emulated card, as Ray's ``HPU`` resource makes it on a Gaudi: it sets
   ``HABANA_VISIBLE_MODULES`` to its local rank (Ray sets it only for workers given ``HPU``, which emulation lacks).
2. ``hccl``: Intel's recipe, Ray's own HPU code path: ``resources_per_worker={"HPU": 1}`` (the cluster declares 2
   ``HPU``), ``TorchConfig(backend="hccl")``, ``RayDDPStrategy()`` with ``accelerator="hpu"``, against the bridge
   double (``tests/bridge_double`` on the workers' ``PYTHONPATH``, emulation off): Ray sets
   ``HABANA_VISIBLE_MODULES``, its HPU device manager asks the double, its ``hccl`` group is the double's
   (``OUT_DIR/ddp_hccl.pt``; the double's cards hold no tensors, so the bridge backend keeps them on the CPU).

``OUT_DIR/facts.json`` says what each worker saw (devices, strategy classes, whether Ray's process group was kept).
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

EPOCHS = 2


def _worker(config: dict[str, Any]) -> None:
    import ray.train
    import torch
    import torch.distributed as dist
    from lightning.fabric import Fabric
    from lightning.pytorch import LightningModule, Trainer
    from ray.train.lightning import (
        RayDDPStrategy,
        RayDeepSpeedStrategy,
        RayFSDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )
    from torch.utils.data import DataLoader, TensorDataset

    import lightning_gaudi  # noqa: F401  (registers the HPU)

    context = ray.train.get_context()
    rank = context.get_world_rank()
    if config["job"] == "hccl":  # Ray gave this worker {"HPU": 1}: Ray set HABANA_VISIBLE_MODULES to its card
        import ray.train.torch
        from ray.air._internal.device_manager import get_torch_device_manager_by_context

        from lightning_gaudi.hpu.bridge import HabanaBackend

        HabanaBackend.device_type = "cpu"  # the double's cards hold no tensors
        hccl_facts = {
            "visible_modules": os.environ.get("HABANA_VISIBLE_MODULES"),
            "device_manager": type(get_torch_device_manager_by_context()).__name__,
            "ray_device": str(ray.train.torch.get_device()),
            "torch_hpu": getattr(getattr(torch, "hpu", None), "__name__", None),
            "backend": dist.get_backend(),
            "master_port": os.environ.get("MASTER_PORT"),
        }
    else:
        os.environ["HABANA_VISIBLE_MODULES"] = str(context.get_local_rank())  # what Ray's HPU resource does
    out = Path(config["out"])
    group = dist.distributed_c10d._get_default_group()  # Ray's, formed before this function runs

    class Regression(LightningModule):
        def __init__(self, case: float) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
            self.case = case

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("case", self.case, on_epoch=True, on_step=False)
            return loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    generator = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(32, 8, generator=generator), torch.randn(32, 1, generator=generator))
    facts: dict[str, Any] = {}

    def save(case: str, state: dict[str, torch.Tensor], prefix: str = "") -> None:
        if rank == 0:
            weights = {key.removeprefix(prefix): value.detach().cpu().clone() for key, value in state.items()}
            torch.save(weights, out / f"{case}.pt")

    def fit(case: str, accelerator: str, strategy: Any, prepare: bool = True, ckpt_path: str | None = None) -> None:
        model = Regression(float(list(CASES).index(case)))
        trainer = Trainer(
            accelerator=accelerator,
            devices="auto",
            strategy=strategy,
            plugins=[RayLightningEnvironment()],
            callbacks=[RayTrainReportCallback()],
            max_epochs=EPOCHS,
            enable_checkpointing=False,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        if prepare:
            trainer = prepare_trainer(trainer)
        trainer.fit(model, DataLoader(data, batch_size=4), ckpt_path=ckpt_path)
        facts[case] = {
            "strategy": [cls.__name__ for cls in type(trainer.strategy).__mro__[:3]],
            "num_devices": trainer.num_devices,
            "world_size": trainer.world_size,
            "sampler_kwargs": trainer.strategy.distributed_sampler_kwargs,
            "root_device": str(trainer.strategy.root_device),
            "kept_rays_group": dist.distributed_c10d._get_default_group() is group,
        }
        # the full state dict the strategy checkpoints (gathered from every rank under FSDP)
        save(case, trainer.strategy.lightning_module_state_dict(), prefix="net.")

    def fabric_loop(case: str, accelerator: str) -> None:
        # Lightning's own DDP on the CPU needs devices = workers per node under Ray: with one device its sampler
        # splits the data in num_nodes x devices = 1 part, which Ray's rank 1 is out of
        devices = 2 if accelerator == "cpu" else "auto"
        fabric = Fabric(accelerator=accelerator, devices=devices, strategy="ddp", plugins=[RayLightningEnvironment()])
        fabric.launch()
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        net, optimizer = fabric.setup(net, torch.optim.SGD(net.parameters(), lr=0.1))
        loader = fabric.setup_dataloaders(DataLoader(data, batch_size=4))
        for epoch in range(EPOCHS):
            loader.sampler.set_epoch(epoch)
            for x, y in loader:
                optimizer.zero_grad()
                fabric.backward(torch.nn.functional.mse_loss(net(x), y))
                optimizer.step()
        facts[case] = {
            "strategy": type(fabric.strategy).__name__,
            "world_size": fabric.world_size,
            "kept_rays_group": dist.distributed_c10d._get_default_group() is group,
        }
        save(case, net.module.state_dict())

    if config["job"] == "hccl":
        fit("ddp_hccl", "hpu", RayDDPStrategy())
        facts["ddp_hccl"].update(hccl_facts)
    else:
        fit("ddp_cpu", "cpu", RayDDPStrategy())
        fit("ddp_hpu", "hpu", RayDDPStrategy())
        fit("fsdp_hpu", "hpu", RayFSDPStrategy())
        fit("hpu_parallel", "hpu", "hpu_parallel", prepare=False)
        if config["deepspeed"]:
            fit("deepspeed_hpu", "hpu", RayDeepSpeedStrategy(stage=2))
        fabric_loop("fabric_cpu", "cpu")
        fabric_loop("fabric_hpu", "hpu")
        first_hpu_epoch = next(
            reported.checkpoint
            for reported in ray.train.get_all_reported_checkpoints()
            if reported.metrics["case"] == CASES.index("ddp_hpu") and reported.metrics["epoch"] == 0
        )
        with first_hpu_epoch.as_directory() as folder:  # Ray Train 2's way to start from a kept checkpoint
            path = Path(folder) / RayTrainReportCallback.CHECKPOINT_NAME
            fit("resumed", "hpu", RayDDPStrategy(), ckpt_path=str(path))
    (out / f"facts.{config['job']}.rank{rank}.json").write_text(json.dumps(facts))


CASES = (
    "ddp_cpu",
    "ddp_hpu",
    "fsdp_hpu",
    "hpu_parallel",
    "deepspeed_hpu",
    "fabric_cpu",
    "fabric_hpu",
    "resumed",
    "ddp_hccl",
)


def main() -> None:
    out, ray_temp = Path(sys.argv[1]).resolve(), sys.argv[2]
    out.mkdir(parents=True, exist_ok=True)
    import ray
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    started = time.monotonic()
    env_vars = {
        "LIGHTNING_GAUDI_EMULATE": "eager",
        "LIGHTNING_GAUDI_DEVICES": "2",
        "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
    }
    ray.init(
        num_cpus=2,
        resources={"HPU": 2},  # as Ray counts a Gaudi node's cards; workers not given HPU see none of them
        include_dashboard=False,
        _temp_dir=ray_temp,
        runtime_env={"env_vars": env_vars},
        log_to_driver=True,
    )
    timings = {"ray_init_s": time.monotonic() - started}
    try:
        scaling = ScalingConfig(num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1})
        run = RunConfig(
            storage_path=str(out / "ray_results"),
            name="cases",
            checkpoint_config=CheckpointConfig(num_to_keep=None),
        )
        result = TorchTrainer(
            _worker,
            train_loop_config={
                "job": "cases",
                "out": str(out),
                "deepspeed": importlib.util.find_spec("deepspeed") is not None,
            },
            scaling_config=scaling,
            run_config=run,
        ).fit()
        timings["cases_s"] = time.monotonic() - started - sum(timings.values())
        (out / "reported.json").write_text(json.dumps([metrics for _, metrics in result.best_checkpoints]))
        # Intel's recipe: {"HPU": 1} per worker and TorchConfig(backend="hccl"), Ray's own HPU code path (its device
        # manager, its HCCL process group) on the bridge double
        double = str(Path(__file__).parents[1] / "bridge_double")
        worker_env = {
            "LIGHTNING_GAUDI_EMULATE": "0",
            "PT_HPU_LAZY_MODE": "0",
            "PYTHONPATH": os.pathsep.join([double, os.environ.get("PYTHONPATH", "")]),
        }
        TorchTrainer(
            _worker,
            train_loop_config={"job": "hccl", "out": str(out)},
            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1, "HPU": 1}),
            torch_config=TorchConfig(backend="hccl"),
            run_config=RunConfig(
                storage_path=str(out / "ray_results"), name="hccl", worker_runtime_env={"env_vars": worker_env}
            ),
        ).fit()
        timings["hccl_s"] = time.monotonic() - started - sum(timings.values())
    finally:
        ray.shutdown()
        timings["total_s"] = time.monotonic() - started
        (out / "timings.json").write_text(json.dumps(timings))


if __name__ == "__main__":
    main()
