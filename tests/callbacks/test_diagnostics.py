"""GraphDiagnostics: every compilation after warm-up reported once with its real cause, in lazy and compile mode."""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.hf_style import HFStyleClassifier, TinyForSequenceClassification, token_loader, token_samples
from helpers.workload import Workload, loader, quiet_trainer
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from torch import Tensor, nn

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import GraphDiagnostics, HPUCompile, dynamo
from lightning_gaudi.data import BucketedPadCollate
from lightning_gaudi.hpu.bridge import BRIDGE_LOG_HINT

# A batch size no other test uses: Lazy Tensor Core keeps compiled graphs for the life of the process, so shapes
# another test already ran would compile nothing here.
BATCH_SIZE = 6

MESSAGES = ("Training batch", "torch.compile", "Validation run")


def _fit(
    model: LightningModule,
    train: Any,
    val: Any = None,
    callbacks: list[Callback] | None = None,
    warmup_steps: int = 3,
    **trainer_kwargs: Any,
) -> tuple[GraphDiagnostics, list[str]]:
    diagnostics = GraphDiagnostics(warmup_steps=warmup_steps)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = quiet_trainer(callbacks=[diagnostics, *(callbacks or [])], **trainer_kwargs)
        trainer.fit(model, train, val)
    return diagnostics, [str(w.message) for w in caught if str(w.message).startswith(MESSAGES)]


class TorchSyncCounter(Callback):
    """torch's own count of host syncs (Lazy Tensor Core's ``aten::_local_scalar_dense``) over the fit."""

    def _read(self) -> int:
        import torch._lazy.metrics

        return int(torch._lazy.metrics.counter_value("aten::_local_scalar_dense") or 0)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start = self._read()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.syncs = self._read() - self.start


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.metrics: dict[str, float] = {}

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        return None

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.metrics.update(metrics)


# ----------------------------------------------------------------------------------------------------------------------
# lazy mode
# ----------------------------------------------------------------------------------------------------------------------


def test_lazy_fixed_shapes_are_quiet(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(Workload(), loader(8, batch_size=BATCH_SIZE))
    assert messages == []
    summary = diagnostics.summary
    assert summary["mode"] == "lazy"
    assert summary["optimizer_steps"] == 8
    assert summary["graph_compilations_in_warmup"] > 0
    assert summary["graph_compilations_after_warmup"] == 0
    assert summary["distinct_input_shapes"] == 1
    assert summary["cpu_fallbacks"] == {}
    assert summary["recompile_reasons"] == []


def test_lazy_host_syncs_over_the_whole_fit_equal_torchs_counter(lazy_hpu: hpu.Backend, tmp_path: Any) -> None:
    """Per-step logging to a logger syncs between batches: counted here, where a batch-start-to-end window saw 0."""
    from lightning.pytorch.loggers import CSVLogger

    torch_count = TorchSyncCounter()
    diagnostics, _ = _fit(
        Workload(),
        loader(6, batch_size=BATCH_SIZE),
        callbacks=[torch_count],
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
    )
    summary = diagnostics.summary
    assert torch_count.syncs > 0, "the logger reads the loss to the host at every step"
    assert summary["host_syncs"] == torch_count.syncs
    assert summary["host_syncs_per_step"] == pytest.approx(torch_count.syncs / 6)
    assert sum(summary["host_syncs_by_phase"].values()) == torch_count.syncs


class ReadsLossInStep(Workload):
    def __init__(self) -> None:
        super().__init__()
        self.losses: list[float] = []

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(loss.item())  # a host sync every step
        return loss


def test_lazy_host_sync_sources_name_the_users_line(lazy_hpu: hpu.Backend, tmp_path: Any) -> None:
    from lightning.pytorch.loggers import CSVLogger

    torch_count = TorchSyncCounter()
    diagnostics, _ = _fit(
        ReadsLossInStep(),
        loader(5, batch_size=BATCH_SIZE),
        callbacks=[torch_count],
        logger=CSVLogger(tmp_path),
        log_every_n_steps=1,
    )
    summary = diagnostics.summary
    line = ReadsLossInStep.training_step.__code__.co_firstlineno + 2
    (location,) = [key for key in summary["host_sync_sources"] if key.endswith(f"test_diagnostics.py:{line}")]
    assert summary["host_sync_sources"][location] == 5
    (detail,) = [d for d in summary["host_sync_source_details"] if d["source"] == location]
    assert detail == {
        "source": location,
        "code": "self.losses.append(loss.item())  # a host sync every step",
        "phase": "training step",
        "user": True,
        "count": 5,
    }
    assert sum(summary["host_sync_sources"].values()) == summary["host_syncs"] == torch_count.syncs
    assert [d for d in summary["host_sync_source_details"] if d["phase"] == "logging" and not d["user"]]


def test_lazy_host_syncs_of_the_library_name_no_user_line(lazy_hpu: hpu.Backend, tmp_path: Any) -> None:
    from lightning.pytorch.loggers import CSVLogger

    diagnostics, _ = _fit(Workload(), loader(5, batch_size=BATCH_SIZE), logger=CSVLogger(tmp_path), log_every_n_steps=1)
    summary = diagnostics.summary
    assert summary["host_syncs"] > 0
    assert sum(summary["host_sync_sources"].values()) == summary["host_syncs"]
    details = summary["host_sync_source_details"]
    assert [d for d in details if d["user"]] == [], details
    assert all(d["source"].startswith("lightning" + os.sep) for d in details), details
    assert {d["phase"] for d in details} == {"logging", "data loader setup"}, details


def test_host_sync_sources_are_only_traced_while_the_callback_runs(lazy_hpu: hpu.Backend) -> None:
    diagnostics, _ = _fit(ReadsLossInStep(), loader(2, batch_size=BATCH_SIZE))
    syncs = diagnostics.summary["host_syncs"]
    assert diagnostics._lazy is not None
    tracer = diagnostics._lazy.sources
    assert tracer is not None
    assert sum(tracer.sources.values()) == syncs
    torch.ones(2, device=lazy_hpu.device()).sum().item()
    assert sum(tracer.sources.values()) == syncs, "a sync after the fit was traced"


def test_lazy_ragged_last_batch_warns_once_naming_the_shapes(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(Workload(), loader(6, batch_size=BATCH_SIZE, ragged=5))
    assert len(messages) == 1
    assert "batch 6 (optimizer step 6) compiled" in messages[0]
    assert "new input shapes [(5, 8), (5, 1)]" in messages[0]
    assert "BucketedPadCollate" in messages[0]
    assert "drop_last=True" in messages[0]
    summary = diagnostics.summary
    assert summary["graph_compilations_after_warmup"] > 0
    assert summary["distinct_input_shapes"] == 2
    assert summary["compilations_by_shape"]["[(5, 8), (5, 1)]"] == summary["graph_compilations_after_warmup"]


class StepConstant(Workload):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return ((self(x) - y) ** 2).mean() + x[:, batch_idx % x.shape[1]].mean()  # a loop index baked into the graph


def test_lazy_changing_python_number_is_named(lazy_hpu: hpu.Backend) -> None:
    _, messages = _fit(StepConstant(), loader(6, batch_size=BATCH_SIZE))
    assert len(messages) == 1
    assert "Python number that changes every step" in messages[0]


def test_lazy_accumulation_raises_no_false_alarm(lazy_hpu: hpu.Backend) -> None:
    """With 2 batches per optimizer step the step's graph compiles at batch 3: still warm-up (step 1)."""
    diagnostics, messages = _fit(
        Workload(optimizer="adamw"), loader(10, batch_size=BATCH_SIZE), accumulate_grad_batches=2
    )
    assert messages == []
    assert diagnostics.summary["optimizer_steps"] == 5
    assert diagnostics.summary["graph_compilations_after_warmup"] == 0


def test_lazy_first_step_after_validation_is_named(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(
        Workload(),
        loader(8, batch_size=BATCH_SIZE),
        loader(1, batch_size=BATCH_SIZE),
        val_check_interval=4,
        limit_val_batches=1,
    )
    assert len(messages) == 1, messages
    assert "batch 4 (optimizer step 4)" in messages[0]
    assert "first training step after validation" in messages[0]
    assert "Python number" not in messages[0]
    assert diagnostics.summary["validation_graph_compilations"] > 0
    assert diagnostics.summary["recompile_reasons"] == ["the first training step after validation"]


class LogsDouble(Workload):
    """Logs a float64 value too: Lazy Tensor Core keeps the graphs that read float32 values for the whole process."""

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        loss = super().training_step(batch, batch_idx)
        self.log("double", loss.double())
        return loss


def test_lazy_first_logging_step_is_blamed_on_logging(lazy_hpu: hpu.Backend, tmp_path: Any) -> None:
    """Lightning's logger reads the logged loss every ``log_every_n_steps``: the first read compiles a graph."""
    from lightning.pytorch.loggers import CSVLogger

    diagnostics, messages = _fit(
        LogsDouble(), loader(8, batch_size=BATCH_SIZE), logger=CSVLogger(tmp_path), log_every_n_steps=6
    )
    assert len(messages) == 1, messages
    assert "batch 5 (optimizer step 5)" in messages[0]
    assert "the first step on which the logger reads the logged values" in messages[0]
    assert "Python number" not in messages[0]
    assert diagnostics.summary["recompile_reasons"] == ["the first step on which the logger reads the logged values"]


def test_lazy_first_step_of_an_epoch_is_named(lazy_hpu: hpu.Backend) -> None:
    """The batch shape was seen in warm-up: not a new shape, but Lightning's end-of-epoch bookkeeping."""
    diagnostics, messages = _fit(LogsDouble(), loader(4, batch_size=BATCH_SIZE), max_epochs=2)
    assert len(messages) == 1, messages
    assert "batch 0 (optimizer step 4)" in messages[0]
    assert "the first training step of an epoch" in messages[0]
    assert "new input shapes" not in messages[0]
    assert "Python number" not in messages[0]
    assert diagnostics.summary["distinct_input_shapes"] == 1


def test_lazy_new_bucket_advice_knows_bucketed_padding_is_in_use(lazy_hpu: hpu.Backend) -> None:
    samples = [s for length in (4, 4, 4, 4, 4, 4, 12, 12) for s in token_samples(1, length, length, seed=length)]
    collate = BucketedPadCollate([8, 16])
    _, messages = _fit(HFStyleClassifier(), token_loader(samples, batch_size=2, collate_fn=collate), warmup_steps=2)
    (message,) = [m for m in messages if "new input shapes" in m]
    assert "BucketedPadCollate already pads to [8, 16]" in message
    assert "warmup_steps" in message
    assert "(lightning_gaudi.data.BucketedPadCollate" not in message


class AdamWithMSE(Workload):
    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        x, y = batch
        return nn.functional.mse_loss(self(x), y)  # Lazy Tensor Core runs mse_loss on the CPU; Gaudi does not


def test_lazy_emulator_fallbacks_are_labelled_not_warned(lazy_hpu: hpu.Backend) -> None:
    diagnostics, messages = _fit(AdamWithMSE(optimizer="adamw"), loader(5, batch_size=BATCH_SIZE))
    assert messages == []
    summary = diagnostics.summary
    assert summary["cpu_fallbacks"]["mse_loss"] == 5
    assert any(op.startswith("lerp") for op in summary["cpu_fallbacks"]), summary["cpu_fallbacks"]
    assert summary["cpu_fallbacks_source"] == "emulator"


def _set_counts(state: ModuleType, compilations: int, fallbacks: dict[str, int]) -> None:
    state.config.metrics["graph_compilation"] = [("TotalNumber", compilations), ("TotalTime", 0), ("AvgTime", 0)]
    state.config.metrics["cpu_fallback"] = [("TotalNumber", sum(fallbacks.values())), ("FallbackOps", fallbacks)]


def test_bridge_counts_from_metric_global(bridge_double: ModuleType) -> None:
    diagnostics = GraphDiagnostics(warmup_steps=1)
    trainer: Any = SimpleNamespace(
        global_step=0, callbacks=[diagnostics], loggers=[], sanity_checking=False, progress_bar_callback=None
    )
    trainer.log_every_n_steps = 50
    _set_counts(bridge_double, 0, {})
    diagnostics.on_fit_start(trainer, None)  # type: ignore[arg-type]
    batch = torch.zeros(4, 2)
    timeline = [(5, {}), (5, {}), (6, {"digamma": 1})]  # counts at the end of each batch
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for index, (compilations, fallbacks) in enumerate(timeline):
            diagnostics.on_train_batch_start(trainer, None, batch, index)  # type: ignore[arg-type]
            _set_counts(bridge_double, compilations, fallbacks)
            trainer.global_step += 1
        diagnostics.on_train_end(trainer, None)  # type: ignore[arg-type]
        diagnostics.on_fit_end(trainer, None)  # type: ignore[arg-type]
    messages = [str(w.message) for w in caught]
    assert len(messages) == 2, messages
    assert "batch 2 (optimizer step 2) compiled 1 new graph" in messages[0]
    assert "digamma" in messages[1]
    assert all(BRIDGE_LOG_HINT in message for message in messages)
    summary = diagnostics.summary
    assert summary["graph_compilations_after_warmup"] == 1
    assert summary["graph_compilations_in_warmup"] == 5
    assert summary["host_syncs"] is None
    assert summary["host_syncs_per_step"] is None
    assert summary["cpu_fallbacks_source"] == "device"


# ----------------------------------------------------------------------------------------------------------------------
# compile mode (aot_eager: tests/conftest.py)
# ----------------------------------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@torch._dynamo.config.patch(recompile_limit=2)
def test_compile_variable_lengths_give_dynamos_reason_and_the_limit(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    """Per-batch padding (DataCollatorWithPadding) with static shapes: every new length recompiles, until the limit."""
    samples = [sample for length in (8, 9, 10, 11) for sample in token_samples(2, length, length)]
    logger = RecordingLogger()
    diagnostics, messages = _fit(
        HFStyleClassifier(),
        token_loader(samples, batch_size=2),
        callbacks=[HPUCompile(dynamic=False)],
        warmup_steps=1,
        logger=logger,
    )
    summary = diagnostics.summary
    assert summary["mode"] == "compile"
    reason = "tensor 'input_ids' size mismatch at index 1. expected 8, actual 9"
    assert summary["recompile_reasons"] == [reason, reason.replace("8, actual 9", "9, actual 10")]
    assert summary["recompile_limit_hit"] is True
    assert summary["distinct_input_shapes"] == 4
    assert summary["graph_compilations_after_warmup"] == 1  # length 9; at length 10 the limit: no graph
    assert summary["recompiles"] == 2  # lengths 9 and 10 (the limit); 11 runs uncompiled
    recompiled = [m for m in messages if "recompiled forward" in m]
    assert len(recompiled) == 1
    assert reason in recompiled[0]
    assert "BucketedPadCollate" in recompiled[0]
    (limit,) = [m for m in messages if "recompile limit" in m]
    assert "run UNCOMPILED" in limit
    assert logger.metrics["graph_diagnostics/recompile_limit_hit"] == 1.0
    assert logger.metrics["graph_diagnostics/graph_compilations_after_warmup"] == 1.0
    assert logger.metrics["graph_diagnostics/distinct_input_shapes"] == 4.0


class PrintsInForward(TinyForSequenceClassification):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        out = super().forward(*args, **kwargs)
        print("logits computed")  # dynamo cannot trace print: a graph break
        return out


class PrintingClassifier(HFStyleClassifier):
    def __init__(self) -> None:
        super().__init__()
        self.model = PrintsInForward(self.model.config)


class BreakingNet(nn.Sequential):
    def forward(self, x: Tensor) -> Tensor:
        hidden = self[0](x)
        print("a graph break")  # one break, ops on both sides: 2 graphs, in 2 frames
        return self[2](self[1](hidden))


class BreaksOnce(Workload):
    def __init__(self) -> None:
        super().__init__()
        self.net = BreakingNet(*self.net)


def test_compile_counts_dynamos_graphs(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    """A model with one graph break is 2 graphs; Hugging Face's ``wrapper`` frames and the like compile none."""
    graphs = dynamo.graphs_compiled()
    diagnostics, _ = _fit(BreaksOnce(), loader(4), callbacks=[HPUCompile()], warmup_steps=1)
    summary = diagnostics.summary
    assert summary["graph_compilations"] == summary["graph_compilations_in_warmup"] == 2
    assert summary["graph_compilations"] == dynamo.graphs_compiled() - graphs
    assert summary["frames_compiled"] >= 2
    assert summary["recompiles"] == 0


@torch._dynamo.config.patch(automatic_dynamic_shapes=False)
def test_compile_recompile_reason_is_the_relevant_guard(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    """After validation the newest cached graph is evaluation's: its failed guard (grad mode) is not the cause of a
    recompile for a new training length; the training graph's size guard is, and the other one is counted."""
    samples = [sample for length in (8, 8, 8, 8, 9, 9) for sample in token_samples(2, length, length)]
    diagnostics, messages = _fit(
        HFStyleClassifier(),
        token_loader(samples, batch_size=2),
        token_loader(token_samples(2, 8, 8), batch_size=2),
        callbacks=[HPUCompile(dynamic=False)],
        warmup_steps=1,
        limit_val_batches=1,
        val_check_interval=2,
    )
    (recompiled,) = [m for m in messages if "recompiled forward" in m]
    assert "Dynamo's reason: tensor 'input_ids' size mismatch at index 1. expected 8, actual 9" in recompiled
    assert "1 other cached graph(s) failed too: GLOBAL_STATE changed: grad_mode" in recompiled
    assert "switched between training and evaluation" not in recompiled
    assert diagnostics.summary["recompiles"] >= 2


def test_compile_graph_breaks_with_the_users_line(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    diagnostics, messages = _fit(PrintingClassifier(), token_loader(token_samples(8, 8, 8)), callbacks=[HPUCompile()])
    line = PrintsInForward.forward.__code__.co_firstlineno + 2
    ((key, count),) = diagnostics.summary["graph_breaks"].items()
    assert key.endswith(f"test_diagnostics.py:{line})")
    assert "print" in key
    assert count >= 1
    breaks = [m for m in messages if "split a graph" in m]
    assert len(breaks) == 1
    assert f"test_diagnostics.py:{line}" in breaks[0]


def test_compile_accumulation_and_fixed_shapes_are_quiet(eager_hpu: hpu.Backend, fresh_dynamo: None) -> None:
    diagnostics, messages = _fit(
        HFStyleClassifier(),
        token_loader(token_samples(16, 8, 8), batch_size=2),
        token_loader(token_samples(2, 8, 8), batch_size=2),
        callbacks=[HPUCompile()],
        warmup_steps=1,
        accumulate_grad_batches=2,
        limit_val_batches=1,
        val_check_interval=4,
    )
    assert messages == []
    summary = diagnostics.summary
    assert summary["optimizer_steps"] == 4
    assert summary["graph_compilations_after_warmup"] == 0
    assert summary["validation_graph_compilations"] >= 1
    assert summary["graph_compilations_in_warmup"] >= 1
    assert summary["compiled_graphs"] >= 2, "training and evaluation graphs"
    assert summary["host_syncs_per_step"] is None, "compile mode cannot count host syncs"


class CompiledTheTorchWay(Workload):
    def __init__(self) -> None:
        super().__init__()
        self.net.compile(backend="aot_eager")  # nn.Sequential of torch's modules: compiles nothing


@pytest.mark.skipif(
    not dynamo.module_compile_skips_torch_modules(),
    reason=f"torch {torch.__version__} compiles torch's own modules under nn.Module.compile() (2.14 and newer)",
)
def test_module_compile_of_torch_modules_is_named(eager_hpu: hpu.Backend) -> None:
    torch._dynamo.reset()  # nothing an earlier test in this worker compiled is counted here
    diagnostics = GraphDiagnostics(warmup_steps=1)
    with pytest.warns(UserWarning, match=r"net \(Sequential\) went through `nn.Module.compile\(\)`.*HPUCompile"):
        quiet_trainer(callbacks=[diagnostics]).fit(CompiledTheTorchWay(), loader(3))
    # what would make dynamo trace into torch's modules: a torch function mode, a global module hook, or a function
    # of torch's replaced (DeepSpeed's ZeRO-3 swaps F.linear; tests/conftest.py puts it back)
    left = (
        torch.overrides._get_current_function_mode_stack(),
        torch.nn.modules.module._global_forward_hooks,
        torch.nn.functional.linear,
    )
    assert diagnostics.summary["graph_compilations"] == 0, f"left active by an earlier test: {left}"


def test_eager_without_compile_counts_nothing(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(eager_hpu, "lazy_counters", lambda: pytest.fail("lazy counters read in eager mode"))
    diagnostics, messages = _fit(Workload(), loader(4, ragged=1))
    assert messages == []
    assert diagnostics.summary["mode"] == "eager"
    assert diagnostics.summary["graph_compilations"] == 0


def test_bad_warmup() -> None:
    with pytest.raises(ValueError, match="warmup_steps"):
        GraphDiagnostics(warmup_steps=-2)
