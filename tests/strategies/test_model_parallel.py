"""``hpu_model_parallel``: FSDP2 and tensor parallelism on the HPU. Quick checks of the strategy's set-up, then real
multi-process runs under eager emulation (gloo) against one process on the same data, and resuming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.distributed as dist
from helpers.models import make_net
from helpers.shared_job import run_once
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import FSDPModule

from lightning_gaudi import HPUCheckpointIO, HPUModelParallelStrategy, HPUPrecision, hpu, resume
from lightning_gaudi.emulator import hccl_group
from lightning_gaudi.strategies.model_parallel import clip_grad_norm_, reduce_with_sums

HELPERS_DIR = Path(__file__).parents[1] / "helpers"
MOMENTUM, CLIP = 0.9, 0.5  # helpers/model_parallel_fit.py's
STEPS, RESUMED_STEPS = 4, 6


def _trainer(**kwargs: Any) -> Trainer:
    kwargs.setdefault("accelerator", "hpu")
    kwargs.setdefault("devices", 2)
    return Trainer(logger=False, enable_checkpointing=False, **kwargs)


def test_the_name_and_lightnings_object_build_the_strategy(eager_hpu: hpu.Backend) -> None:
    strategy = _trainer(strategy="hpu_model_parallel").strategy
    assert type(strategy) is HPUModelParallelStrategy
    assert isinstance(strategy.checkpoint_io, HPUCheckpointIO)
    assert strategy._get_process_group_backend() == "hccl"
    assert strategy.root_device == torch.device("cpu")
    adopted = _trainer(strategy=ModelParallelStrategy(tensor_parallel_size=2)).strategy
    assert type(adopted) is HPUModelParallelStrategy
    assert adopted._tensor_parallel_size == 2


@pytest.mark.parametrize(
    ("sizes", "devices", "match"),
    [
        ((2, 2), 2, r"`data_parallel_size=2` x `tensor_parallel_size=2` must equal the world size.* = 2"),
        ((3, "auto"), 2, r"`data_parallel_size=3` x `tensor_parallel_size=2` must equal the world size"),
        ((0, 2), 2, r"`data_parallel_size=0` must be a positive int or 'auto'"),
        ((1, "two"), 2, r"`tensor_parallel_size='two'` must be a positive int or 'auto'"),
    ],
)
def test_bad_sizes_are_refused_before_any_process_starts(
    eager_hpu: hpu.Backend, sizes: tuple[Any, Any], devices: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        _trainer(strategy=HPUModelParallelStrategy(*sizes), devices=devices)


def test_a_module_without_configure_model_is_refused_before_any_process_starts(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    from helpers.models import RegressionModel, regression_loader
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    def start(self: _SubprocessScriptLauncher) -> None:
        raise AssertionError("the rank processes were about to start")

    monkeypatch.setattr(_SubprocessScriptLauncher, "_call_children_scripts", start)
    trainer = _trainer(strategy="hpu_model_parallel", max_steps=1)
    assert isinstance(trainer.strategy.launcher, _SubprocessScriptLauncher)  # Lightning's checks of it still hold
    with pytest.raises(TypeError, match=r"'hpu_model_parallel' needs `configure_model\(\)` in RegressionModel"):
        trainer.fit(RegressionModel(), regression_loader())


def test_auto_sizes_are_the_nodes_and_the_cards_per_node(eager_hpu: hpu.Backend) -> None:
    from lightning_gaudi.strategies.model_parallel import mesh_shape

    assert mesh_shape("auto", "auto", 1, 2) == (1, 2)
    assert mesh_shape("auto", "auto", 2, 4) == (2, 4)
    assert mesh_shape(4, 1, 1, 4) == (4, 1)
    _trainer(strategy=HPUModelParallelStrategy())  # (1, 2) on 2 devices


def test_lazy_mode_is_refused(lazy_hpu: hpu.Backend) -> None:
    with pytest.raises(ValueError, match=r"'hpu_model_parallel' cannot run in lazy mode: Intel supports DTensor"):
        _trainer(strategy="hpu_model_parallel", devices=1)


def test_bridge_path_uses_the_hpu_device_hccl_and_hpu_autocast(
    bridge_double: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "0")
    trainer = _trainer(strategy="hpu_model_parallel", precision="bf16-mixed")
    assert trainer.strategy.root_device == torch.device("hpu")  # the mesh's device type
    assert trainer.strategy._get_process_group_backend() == "hccl"
    assert isinstance(trainer.precision_plugin, HPUPrecision)
    assert trainer.precision_plugin.device == "hpu"
    monkeypatch.setenv("PT_HPU_LAZY_MODE", "1")
    with pytest.raises(ValueError, match="cannot run in lazy mode"):
        _trainer(strategy="hpu_model_parallel")


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "bf16-true"])
def test_the_precision_plugin_clips_over_the_shards(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, precision: str
) -> None:
    """Trainer(precision=...) builds a plugin of the DTensorClipping kind; its clip_grad_by_norm is the shards' one."""
    from lightning_gaudi.strategies import model_parallel

    trainer = _trainer(strategy="hpu_model_parallel", precision=precision)
    plugin = trainer.precision_plugin
    assert isinstance(plugin, model_parallel.DTensorClipping)
    assert "clip_grad_by_norm" not in vars(plugin), "a method of its class, not set on the instance"
    calls: list[float] = []
    monkeypatch.setattr(model_parallel, "clip_grad_norm_", lambda params, clip: calls.append(clip))
    net = make_net()
    plugin.clip_grad_by_norm(torch.optim.SGD(net.parameters()), 0.5)
    assert calls == [0.5]


def test_clipping_plain_tensors_matches_torch() -> None:
    nets = [make_net(), make_net()]
    nets[1].load_state_dict(nets[0].state_dict())
    for net in nets:
        net(torch.ones(3, 4)).sum().mul(10).backward()
    norm = clip_grad_norm_(nets[0].parameters(), 0.5)
    torch.testing.assert_close(norm, torch.nn.utils.clip_grad_norm_(nets[1].parameters(), 0.5))
    for ours, theirs in zip(nets[0].parameters(), nets[1].parameters(), strict=True):
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.fixture
def sharded_net() -> Iterator[torch.nn.Module]:
    """A net with FSDP2 on each linear layer and the root, on a 1-rank emulated HCCL group."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    hccl_group.register_emulated_hccl()
    dist.init_process_group("hccl", store=dist.HashStore(), rank=0, world_size=1)
    try:
        net = make_net()
        mesh = init_device_mesh("cpu", (1,))
        for layer in (net[0], net[2]):
            fully_shard(layer, mesh=mesh)
        yield fully_shard(net, mesh=mesh)
    finally:
        dist.destroy_process_group()


def test_every_fsdp2_module_is_set_to_reduce_with_sums(
    sharded_net: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.fsdp import FSDPModule

    calls: list[tuple[torch.nn.Module, bool]] = []
    set_sums = lambda self, on: calls.append((self, on))  # noqa: E731
    monkeypatch.setattr(FSDPModule, "set_force_sum_reduction_for_comms", set_sums, raising=False)  # torch 2.7 lacks it
    assert reduce_with_sums(sharded_net, 2, "hpu_model_parallel") == 3
    assert calls == [(sharded_net, True), (sharded_net[0], True), (sharded_net[2], True)]  # the setting is per module
    assert reduce_with_sums(make_net(), 2, "hpu_model_parallel") == 0  # tensor parallelism alone: nothing to set


def test_a_torch_without_sum_reductions_is_refused_at_set_up(
    sharded_net: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch 2.7's FSDP2 (Gaudi software 1.22) averages with AVG, even over one data-parallel rank (HCCL refused it in
    the 2-process "both-dp1-tp2" fit on torch 2.7.1): refused before the first backward."""
    from torch.distributed.fsdp import FSDPModule

    monkeypatch.delattr(FSDPModule, "set_force_sum_reduction_for_comms", raising=False)
    for dp in (2, 1):
        with pytest.raises(
            RuntimeError, match=rf"FSDP2 on torch .*\({dp} data-parallel HPUs\).*ReduceOp\.AVG.*'hpu_fsdp'"
        ):
            reduce_with_sums(sharded_net, dp, "hpu_model_parallel")
    assert reduce_with_sums(make_net(), 2, "hpu_model_parallel") == 0  # tensor parallelism alone: nothing to reduce


# ---------------------------------------------------------------------------------------------------------------------
# Real runs: 2 processes on the emulated HPU
# ---------------------------------------------------------------------------------------------------------------------


def run_helper(
    script: str, out: Path, *args: str, timeout: int = 240, torchrun: bool = False
) -> subprocess.CompletedProcess[str]:
    """Runs ``tests/helpers/<script>`` as a fresh launch under eager emulation: Lightning or the test starts the other
    ranks or, with ``torchrun``, torchrun starts every rank (and exits with the code of any rank that failed)."""
    launch_vars = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "GROUP_RANK")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LIGHTNING_GAUDI_", "TORCHELASTIC_", "SLURM_"))}
    for name in launch_vars:
        env.pop(name, None)
    env.pop("DS_ACCELERATOR", None)  # the strategy chooses it
    env[hpu.EMULATE_ENV] = "eager"
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(HELPERS_DIR / script), str(out), *args]
    if torchrun:
        env["OMP_NUM_THREADS"] = "1"
        launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "--monitor-interval", "0.2"]
        command[1:1] = launcher
    proc = subprocess.run(command, cwd=out, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"exit code {proc.returncode}\n" + proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def ranks_facts(out: Path, mode: str, world_size: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"{mode}-rank{r}.json").read_text()) for r in range(world_size)]


def steps_of(ranks: list[dict[str, Any]]) -> list[tuple[list[Any], list[Any]]]:
    """Each step's data as one process sees it: the union of the batches of the distinct data-parallel ranks."""
    by_dp = {facts["data_parallel_rank"]: facts["batches"] for facts in ranks}
    steps = []
    for batches in zip(*(by_dp[r] for r in sorted(by_dp)), strict=True):
        steps.append(([row for x, _ in batches for row in x], [row for _, y in batches for row in y]))
    return steps


def reference(
    initial: dict[str, list[Any]], steps: list[tuple[Any, Any]], losses: list[float] | None = None
) -> dict[str, torch.Tensor]:
    """SGD with momentum and clipping by the global norm, in one process on each step's union of batches (each step's
    loss appended to ``losses``)."""
    net = make_net()
    net.load_state_dict({name.removeprefix("net."): torch.tensor(value) for name, value in initial.items()})
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1, momentum=MOMENTUM)
    for x, y in steps:
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(net(torch.tensor(x)), torch.tensor(y))
        loss.backward()
        if losses is not None:
            losses.append(loss.item())
        torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
        optimizer.step()
    return {f"net.{name}": tensor for name, tensor in net.state_dict().items()}


def assert_matches_reference(ranks: list[dict[str, Any]], expected: dict[str, torch.Tensor]) -> None:
    for facts in ranks:
        for name, tensor in expected.items():
            assert torch.equal(torch.tensor(facts["final"][name]), torch.tensor(ranks[0]["final"][name])), name
            torch.testing.assert_close(torch.tensor(facts["final"][name]), tensor, rtol=1e-5, atol=1e-6)


#: (plan, data-parallel size, tensor-parallel size)
LAYOUTS = [("tp", 1, 2), ("fsdp", 2, 1), ("both", 1, 2), ("both", 2, 1)]
#: ``helpers/fabric_sharded.py``'s loops the layouts job runs too (for tests/fabric/test_model_parallel.py): their
#: kinds, steps before the checkpoint and steps in all
FABRIC_KINDS, FABRIC_STEPS, FABRIC_TOTAL = ("tp", "fsdp2", "fsdp"), 3, 5


def fsdp2_reduces_with_sums() -> bool:
    """Whether this torch's FSDP2 can reduce with HCCL's ops (if not, it is refused at set-up: tested above)."""
    return hasattr(FSDPModule, "set_force_sum_reduction_for_comms")


def layouts_job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of one torchrun job (once per pytest run) that fits every layout this torch runs, one after another
    in the same 2 processes, each into ``<plan>-dp<dp>-tp<tp>``, and resumes the tp and fsdp layouts (resuming: they
    cover it), then runs the Fabric loops into ``fabric/<kind>``; its stderr in ``stderr.txt``.
    ``tests/strategies/test_clean_exit.py`` reads its exit, too."""

    def job(out: Path) -> None:
        layouts = [f"{plan},{dp},{tp},{int(plan != 'both')}" for plan, dp, tp in LAYOUTS]
        fabric_kinds = list(FABRIC_KINDS)
        if not fsdp2_reduces_with_sums():
            layouts = [layout for layout in layouts if layout.startswith("tp,")]
            fabric_kinds.remove("fsdp2")
        fabric = ("--fabric", ",".join(fabric_kinds), str(FABRIC_STEPS), str(FABRIC_TOTAL))
        args = ("layouts", str(STEPS), str(RESUMED_STEPS), *layouts, *fabric)
        proc = run_helper("model_parallel_fit.py", out, *args, timeout=480, torchrun=True)
        (out / "stderr.txt").write_text(proc.stderr)

    return run_once(tmp_path_factory, "model-parallel-layouts", job)


@pytest.fixture(scope="module", params=LAYOUTS, ids=lambda layout: f"{layout[0]}-dp{layout[1]}-tp{layout[2]}")
def fitted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, tuple[Any, ...]]:
    """One layout's folder in the layouts job, and the layout."""
    plan, dp, tp = request.param
    if plan != "tp" and not fsdp2_reduces_with_sums():
        pytest.skip(
            f"torch {torch.__version__}'s FSDP2 cannot reduce with HCCL's ops: refused at set-up (tested above)"
        )
    job = layouts_job(tmp_path_factory)
    stderr = (job / "stderr.txt").read_text()
    assert "HPUs: 2 per node x 1 node(s), GAUDI2 emulated on the CPU (eager mode), HCCL emulated over gloo" in stderr
    return job / f"{plan}-dp{dp}-tp{tp}", request.param


@pytest.mark.subprocess
def test_two_processes_train_to_the_weights_of_one(fitted: tuple[Path, tuple[Any, ...]]) -> None:
    out, (plan, dp, tp) = fitted
    ranks = ranks_facts(out, "fit")
    initial = ranks[0]["initial"]
    total_bytes = sum(torch.tensor(value).nbytes for value in initial.values())
    for facts in ranks:
        assert facts["mesh_device"] == "cpu"
        assert facts["steps"] == STEPS
        assert facts["start"] == initial  # the plan keeps the weights, only splits them
        if tp == 2 or plan == "fsdp":  # every parallelized weight is split in two; biases partly
            assert facts["parameter_bytes"] < 0.8 * total_bytes, (facts["parameter_bytes"], total_bytes)
            assert facts["optimizer_bytes"] < 0.8 * total_bytes
    # FSDP2 reduce-scatters its gradients with a sum HCCL has, then divides (AVG by default: refused by HCCL)
    reduce_scatter_ops = {op for facts in ranks for op in facts["reduce_scatter_ops"]}
    assert reduce_scatter_ops <= {"SUM"}
    if plan != "tp" and dp == 2:
        assert reduce_scatter_ops == {"SUM"}
    if dp == 2:  # the ranks read different halves of the data
        assert {facts["data_parallel_rank"] for facts in ranks} == {0, 1}
        assert ranks[0]["batches"] != ranks[1]["batches"]
    else:
        assert ranks[0]["batches"] == ranks[1]["batches"]
    losses: list[float] = []
    expected = reference(initial, steps_of(ranks), losses)
    assert_matches_reference(ranks, expected)
    # each step's loss: on 2 data-parallel ranks the mean of the halves' (equal halves) is the union's on 1 process
    by_dp = {facts["data_parallel_rank"]: facts["losses"] for facts in ranks}
    torch.testing.assert_close(torch.tensor(list(by_dp.values())).mean(0), torch.tensor(losses), rtol=1e-5, atol=1e-6)
    for name in expected:
        assert ranks[0]["final"][name] != initial[name], f"{name} never trained"


@pytest.mark.subprocess
@pytest.mark.parametrize("kind", ["sharded", "full"])
def test_a_checkpoint_saved_mid_run_resumes_to_the_uninterrupted_result(
    fitted: tuple[Path, tuple[Any, ...]], kind: str
) -> None:
    """The fit job resumed, in its own processes, from each checkpoint it saved (fresh Trainer, strategy and model)."""
    out, (plan, _, _) = fitted
    if plan == "both":
        pytest.skip("resuming is covered by the tp and fsdp layouts")
    checkpoint = out / f"{kind}.ckpt"
    if kind == "sharded":  # one shard per rank and the checksum index, renamed into place complete: no staging left
        files = {"__0_0.distcp", "__1_0.distcp", ".metadata", resume.CHECKSUMS_FILENAME, "meta.pt"}
        assert {p.name for p in checkpoint.iterdir()} == files
        assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
        # it was resumed through the policy over a folder that also holds a newer copy with bytes of rank 1's shard
        # flipped: every rank's policy skipped that copy (a rank that loaded it would not start at the fit's weights)
        assert {p.name for p in (out / "ckpt").iterdir()} == {"intact.ckpt", "newer.ckpt"}
    else:  # the full weights, plain names, for inference
        state = torch.load(checkpoint, weights_only=False)
        assert set(state["state_dict"]) == set(ranks_facts(out, "fit")[0]["initial"])
    fitted_ranks, resumed = ranks_facts(out, "fit"), ranks_facts(out, f"resume-{kind}")
    for facts in resumed:
        assert facts["start_step"] == STEPS
        assert facts["start"] == fitted_ranks[0]["final"]
    # the momentum buffers were restored too: the resumed steps continue the uninterrupted run
    expected = reference(fitted_ranks[0]["initial"], steps_of(fitted_ranks) + steps_of(resumed))
    assert_matches_reference(resumed, expected)
