"""The ``"hpu_deepspeed"`` strategy: DeepSpeed ZeRO (stages 1 to 3) over HCCL, gloo in emulation."""

from __future__ import annotations

import inspect
import json
import logging
import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any, ClassVar

import torch
from lightning.fabric.plugins import ClusterEnvironment
from lightning.fabric.utilities.types import _PATH
from lightning.pytorch.accelerators import Accelerator
from lightning.pytorch.plugins.precision import DeepSpeedPrecision, Precision
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, Strategy
from lightning.pytorch.utilities import GradClipAlgorithmType, rank_zero_warn
from lightning_utilities.core.imports import RequirementCache
from torch.optim import Optimizer
from torch.optim.lr_scheduler import ChainedScheduler, SequentialLR
from typing_extensions import override

from lightning_gaudi import hpu
from lightning_gaudi.distributed import DEFAULT_TIMEOUT
from lightning_gaudi.hpu.deepspeed_accelerator import (
    INTEL_FORK_INSTALL,
    DeepSpeedMissingError,
    is_intel_fork,
    missing_deepspeed_message,
    select_deepspeed_accelerator,
)
from lightning_gaudi.patches import deepspeed_strategy
from lightning_gaudi.strategies._staged import save_staged
from lightning_gaudi.strategies.adoption import Adoption
from lightning_gaudi.strategies.core import TrainerParallelCore, refuse_unknown_arguments

#: Truthy when DeepSpeed is installed (checked without importing it).
DEEPSPEED_AVAILABLE = RequirementCache("deepspeed")
#: The ZeRO stages DeepSpeed has: 0 (off), 1 (optimizer state), 2 (and gradients), 3 (and parameters).
ZERO_STAGES = (0, 1, 2, 3)
#: The arguments of Lightning's ``DeepSpeedStrategy`` it writes into its ``config`` (``logging_level``: into
#: DeepSpeed's logger), all but ``config`` itself and what it keeps as attributes.
CONFIG_ARGUMENTS = (
    *("zero_optimization", "stage", "offload_optimizer", "offload_parameters", "offload_params_device", "nvme_path"),
    *("params_buffer_count", "params_buffer_size", "max_in_cpu", "offload_optimizer_device", "optimizer_buffer_count"),
    *("block_size", "queue_depth", "single_submit", "overlap_events", "thread_count", "pin_memory", "sub_group_size"),
    *("contiguous_gradients", "overlap_comm", "allgather_partitions", "reduce_scatter", "allgather_bucket_size"),
    *("reduce_bucket_size", "zero_allow_untested_optimizer", "logging_batch_size_per_gpu", "logging_level"),
    *("partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"),
    "synchronize_checkpoint_boundary",
)
#: The names registered besides ``"hpu_deepspeed"`` (ZeRO-2), and the arguments each implies.
DEEPSPEED_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = tuple(
    (f"hpu_deepspeed_stage_{stage}", {"stage": stage}) for stage in (1, 2, 3)
)


def _plain(value: Any) -> Any:
    """``value`` with every mapping a ``dict`` and every list-like a ``list`` (Hydra's containers included)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)):
        return [_plain(item) for item in value]
    return value


def _check_stage(stage: Any, where: str) -> None:
    if isinstance(stage, bool) or stage not in ZERO_STAGES:
        raise ValueError(
            f"{where}={stage!r} is not a ZeRO stage. DeepSpeed has stages 0 (off), 1 (partitions the optimizer"
            " state), 2 (and the gradients) and 3 (and the parameters); for more memory than stage 3 saves, add"
            " `offload_optimizer=True` / `offload_parameters=True`."
        )


def load_config(config: Mapping[str, Any] | str | Path | None) -> dict[str, Any] | None:
    """A DeepSpeed config as a new ``dict``, from a mapping (a Hydra node too), a JSON file, or (when ``None``) the
    file named by ``PL_DEEPSPEED_CONFIG_PATH``; ``None`` when there is none. Raises for a missing or malformed file."""
    if config is None:
        config = os.environ.get(DeepSpeedStrategy.DEEPSPEED_ENV_VAR)
        if config is None:
            return None
    if isinstance(config, Mapping):
        return _plain(config)
    if not isinstance(config, (str, Path)):
        raise TypeError(
            f"`config` must be a DeepSpeed config dict or the path of a JSON file, got {type(config).__name__}."
        )
    path = Path(config)
    if not path.is_file():
        raise FileNotFoundError(f"The DeepSpeed config file {str(path)!r} does not exist.")
    try:
        loaded = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"The DeepSpeed config file {str(path)!r} is not valid JSON: {err}.") from err
    if not isinstance(loaded, dict):
        raise ValueError(f"The DeepSpeed config file {str(path)!r} holds a {type(loaded).__name__}, not a JSON object.")
    return loaded


def check_config(config: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` for what DeepSpeed or Lightning would refuse only once the processes run: an unknown
    ZeRO stage, a ``zero_optimization`` section DeepSpeed rejects, settings the Trainer owns. Imports DeepSpeed."""
    if "gradient_accumulation_steps" in config:
        raise ValueError(
            "Remove `gradient_accumulation_steps` from the DeepSpeed config: the strategy sets it from"
            " `Trainer(accumulate_grad_batches=...)`."
        )
    zero = config.get("zero_optimization")
    if zero is None or isinstance(zero, bool):
        return
    if not isinstance(zero, Mapping):
        raise ValueError(f"`zero_optimization` in the DeepSpeed config must be a mapping, got {zero!r}.")
    if "stage" in zero:
        _check_stage(zero["stage"], "`zero_optimization.stage`")
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    from pydantic import ValidationError

    try:
        DeepSpeedZeroConfig(**zero)
    except ValidationError as err:
        raise ValueError(f"DeepSpeed rejects the `zero_optimization` section of the config: {err}") from err


def gradient_clipping(config: Mapping[str, Any], clip_val: float | None, algorithm: str | None) -> float:
    """The ``gradient_clipping`` DeepSpeed must use: the Trainer's ``gradient_clip_val`` (0 when unset), never
    DeepSpeed's default of 1.0. ``ValueError`` when the config disagrees, or for clipping by value."""
    wanted = float(clip_val or 0.0)
    if wanted and algorithm == GradClipAlgorithmType.VALUE:
        raise ValueError(
            "DeepSpeed clips gradients by norm only, but the Trainer has gradient_clip_algorithm='value'. Use"
            " `Trainer(gradient_clip_val=..., gradient_clip_algorithm='norm')`."
        )
    given = config.get("gradient_clipping")
    if given is not None and float(given) != wanted:
        trainer = f"gradient_clip_val={clip_val!r}" if clip_val else "no gradient_clip_val (no clipping)"
        raise ValueError(
            f"The DeepSpeed config has gradient_clipping={given!r}, but the Trainer has {trainer}. The Trainer's"
            " setting decides: remove `gradient_clipping` from the config and set"
            f" `Trainer(gradient_clip_val={given!r})` to clip at {given!r}."
        )
    return wanted


#: A torch LR scheduler's values by param group, in the order of the optimizer's groups.
_PER_GROUP = ("base_lrs", "lr_lambdas", "max_lrs", "min_lrs", "base_momentums", "max_momentums")


def _drop_empty_groups(optimizer: Optimizer, scheduler: Any) -> None:
    """Drops ``optimizer``'s empty param groups, which DeepSpeed drops, and their values in ``scheduler`` (whose steps
    would fail); ``ValueError`` for chained schedulers, which keep values by group elsewhere."""
    groups = optimizer.param_groups
    keep = [i for i, group in enumerate(groups) if group["params"]]
    if len(keep) == len(groups):
        return
    if isinstance(scheduler, ChainedScheduler | SequentialLR):
        raise ValueError(
            f"hpu_deepspeed: the optimizer has {len(groups) - len(keep)} empty param group(s), which DeepSpeed drops,"
            f" and {type(scheduler).__name__} chains schedulers built with them. Leave the empty groups out of the"
            " optimizer in configure_optimizers."
        )
    for name in _PER_GROUP:
        values = getattr(scheduler, name, None)
        if isinstance(values, list) and len(values) == len(groups):
            setattr(scheduler, name, [values[i] for i in keep])
    groups[:] = [groups[i] for i in keep]


class HPUDeepSpeedStrategy(TrainerParallelCore, DeepSpeedStrategy):
    """DeepSpeed ZeRO on HPUs, one process per card (``docs/strategies.md``); Lightning's names (``"deepspeed"``,
    ``"deepspeed_stage_3"``...) run it with ``accelerator="hpu"``. Gradient clipping is the Trainer's; a checkpoint
    is a folder of every rank's shards, staged and renamed into place.

    Args:
        zero_optimization: enable ZeRO (``False``: DeepSpeed's data parallelism alone).
        stage: the ZeRO stage, 0 to 3 (a ``config``'s ``zero_optimization.stage`` decides instead).
        config: a DeepSpeed config (a dict, a Hydra node, or a JSON file's path), replacing every other ZeRO argument;
            ``gradient_clipping`` and ``gradient_accumulation_steps`` come from the Trainer.
        offload_optimizer, offload_parameters, ..., exclude_frozen_parameters: as Lightning's ``DeepSpeedStrategy``.
        accelerator, parallel_devices, cluster_environment, process_group_backend, timeout: as every HPU strategy
            (:class:`~lightning_gaudi.strategies.core.HPUStrategyCore`).
        precision_plugin: a ``DeepSpeedPrecision``; normally chosen from ``Trainer(precision=...)``.
        **kwargs: any other argument of Lightning's ``DeepSpeedStrategy``.

    Raises:
        ImportError: DeepSpeed is not installed (or, on Gaudi, cannot drive the HPU), with the command to install it.
        ValueError: a ZeRO stage other than 0 to 3, a bad config (see :func:`check_config`), an accelerator that is no
            HPU, lazy emulation, or ``DS_ACCELERATOR`` set to another accelerator.
        TypeError: an argument Lightning's ``DeepSpeedStrategy`` does not take.
        RuntimeError: DeepSpeed was imported earlier with another accelerator.
    """

    strategy_name = "hpu_deepspeed"
    registered_variants = DEEPSPEED_VARIANTS
    backward_collective = "backward (ZeRO gradient reduction)"
    forward_collective = "forward (ZeRO-3 parameter gather)"
    lightning_counterparts: ClassVar[tuple[type[Strategy], ...]] = (DeepSpeedStrategy,)
    # every ZeRO, offload and activation-checkpointing argument is in the object's `config`, read back whole
    adoption = Adoption(folded=frozenset(CONFIG_ARGUMENTS))

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        config: dict[str, Any] | str | Path | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        remote_device: str | None = None,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        sub_group_size: int = 1_000_000_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: str | int = "auto",
        logging_level: int = logging.WARN,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        load_full_weights: bool = False,
        exclude_frozen_parameters: bool = False,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision_plugin: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        deepspeed_strategy.check_supported()
        _check_stage(stage, "`stage`")
        accepted = set(inspect.signature(DeepSpeedStrategy.__init__).parameters) - {"self"}
        own = set(inspect.signature(HPUDeepSpeedStrategy.__init__).parameters) - {"self", "kwargs"}
        refuse_unknown_arguments(
            "HPUDeepSpeedStrategy", kwargs, accepted, "Lightning's DeepSpeedStrategy's", accepted | own
        )
        backend = hpu.get_backend()
        if not DEEPSPEED_AVAILABLE:
            raise DeepSpeedMissingError(missing_deepspeed_message(backend, type(self).__name__))
        loaded = load_config(config)
        select_deepspeed_accelerator(backend, type(self).__name__)
        if loaded is not None:
            check_config(loaded)
        if backend.wants_intel_deepspeed:
            import deepspeed

            if not is_intel_fork(deepspeed.__version__):
                rank_zero_warn(
                    f"DeepSpeed {deepspeed.__version__} is not Intel's Gaudi fork; install it: `{INTEL_FORK_INSTALL}`."
                )
        super().__init__(
            accelerator=accelerator,
            zero_optimization=zero_optimization,
            stage=stage,
            config=loaded,
            offload_optimizer=offload_optimizer,
            offload_parameters=offload_parameters,
            remote_device=remote_device,
            contiguous_gradients=contiguous_gradients,
            overlap_comm=overlap_comm,
            allgather_bucket_size=allgather_bucket_size,
            reduce_bucket_size=reduce_bucket_size,
            sub_group_size=sub_group_size,
            zero_allow_untested_optimizer=zero_allow_untested_optimizer,
            logging_batch_size_per_gpu=logging_batch_size_per_gpu,
            logging_level=logging_level,
            partition_activations=partition_activations,
            cpu_checkpointing=cpu_checkpointing,
            load_full_weights=load_full_weights,
            exclude_frozen_parameters=exclude_frozen_parameters,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            **kwargs,
        )

    @property  # type: ignore[override]
    @override
    def precision_plugin(self) -> Precision:
        return self._precision_plugin if self._precision_plugin is not None else DeepSpeedPrecision("32-true")

    @precision_plugin.setter
    @override
    def precision_plugin(self, precision_plugin: Precision | None) -> None:
        if precision_plugin is not None and not isinstance(precision_plugin, DeepSpeedPrecision):
            raise ValueError(
                f"{self.strategy_name!r} trains through DeepSpeed's engine, which needs Lightning's DeepSpeedPrecision,"
                f" not {type(precision_plugin).__name__}. Pass `Trainer(precision=...)` (e.g. 'bf16-mixed') and no"
                " precision plugin."
            )
        self._precision_plugin = precision_plugin

    def hpu_precision_plugin(self, precision: str) -> Precision | None:
        """Lightning's ``DeepSpeedPrecision`` for ``Trainer(precision=precision)``."""
        return DeepSpeedPrecision(precision)  # type: ignore[arg-type]  # checked by the plugin

    @override
    def setup_environment(self) -> None:
        # Lightning's DeepSpeedStrategy refuses every accelerator but CUDA here; DDP's set-up is what it runs past that
        assert self.lightning_module is not None
        assert isinstance(self.config, dict)
        trainer = self.lightning_module.trainer
        clip = gradient_clipping(self.config, trainer.gradient_clip_val, trainer.gradient_clip_algorithm)
        self.config["gradient_clipping"] = clip
        DDPStrategy.setup_environment(self)
        self._prepare_trainer(trainer)

    @override
    def setup_distributed(self) -> None:
        import deepspeed

        super().setup_distributed()
        # parts of DeepSpeed read its launcher's variables
        os.environ.update(RANK=str(self.global_rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank))
        # adopts the process group formed above (and builds or loads DeepSpeed's communication op)
        with deepspeed_strategy.bounded_build_lock(self.timeout):
            deepspeed.init_distributed(self._process_group_backend, auto_mpi_discovery=False, timeout=self.timeout)

    @override
    def init_deepspeed(self) -> None:
        # Lightning gives DeepSpeed the root device's index as its device rank, None on the HPU (the bridge binds one
        # card per process) and on the emulated CPU, in every stage; an op built here waits for its lock at most timeout
        with deepspeed_strategy.device_rank(self.local_rank), deepspeed_strategy.bounded_build_lock(self.timeout):
            super().init_deepspeed()

    @override
    def _setup_model_and_optimizer(
        self, model: torch.nn.Module, optimizer: Optimizer | None, lr_scheduler: Any = None
    ) -> tuple[Any, Optimizer]:
        if optimizer is not None and lr_scheduler is not None:
            _drop_empty_groups(optimizer, lr_scheduler)
        return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)

    @override
    def save_checkpoint(self, checkpoint: dict, filepath: _PATH, storage_options: Any | None = None) -> None:
        """Writes the checkpoint directory ``filepath`` (every rank its shards), staged and renamed into place
        (:func:`~lightning_gaudi.strategies._staged.save_staged`); URLs are refused."""
        save_staged(self, filepath, lambda staging: super(HPUDeepSpeedStrategy, self).save_checkpoint(
            checkpoint, staging, storage_options
        ))  # fmt: skip
