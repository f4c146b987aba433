"""FusedKernels: a Hugging Face LLaMA's attention, RMSNorm and RoPE through the seam (FusedSDPA, FusedRMSNorm,
FusedRoPE on the bridge double)."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest
import torch
from helpers.workload import quiet_trainer
from lightning.pytorch import LightningModule, seed_everything
from lightning.pytorch.plugins.precision import Precision
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FusedKernels, HPUCompile

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama  # noqa: E402

LAYERS = 2


def llama(**config: Any) -> nn.Module:
    settings: dict[str, Any] = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "attn_implementation": "sdpa",
    }
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**settings, **config}))


class CausalLM(LightningModule):
    def __init__(self, **config: Any) -> None:
        super().__init__()
        self.model = llama(**config)
        self.losses: list[Tensor] = []

    def training_step(self, batch: Tensor, batch_idx: int) -> Tensor:
        loss = self.model(input_ids=batch, labels=batch).loss
        self.losses.append(loss.detach().float())
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def _batches(steps: int = 3) -> torch.utils.data.DataLoader[Tensor]:
    return torch.utils.data.DataLoader(
        torch.randint(0, 128, (steps, 2, 12), generator=torch.Generator().manual_seed(1)), batch_size=None
    )


def _fit(callbacks: list[Any], steps: int = 3, **trainer_kwargs: Any) -> CausalLM:
    seed_everything(0, verbose=False)
    module = CausalLM()
    quiet_trainer(max_steps=steps, callbacks=callbacks, **trainer_kwargs).fit(module, _batches(steps))
    return module


def _count_seam(backend: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    counts: Counter[str] = Counter()
    for name in ("sdpa", "rms_norm", "rope"):
        plain = getattr(backend, name)

        def counting(*args: Any, _name: str = name, _plain: Any = plain, **kwargs: Any) -> Tensor:
            counts[_name] += 1
            return _plain(*args, **kwargs)

        monkeypatch.setattr(backend, name, counting)
    return counts


def test_llama_trains_to_the_same_losses_through_the_seam(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    counts = _count_seam(eager_hpu, monkeypatch)
    plain = _fit([])
    assert not counts
    fused = _fit([FusedKernels()])
    # the same math in another order of float operations (torch 2.7's kernels round one weight differently)
    torch.testing.assert_close(torch.stack(fused.losses), torch.stack(plain.losses), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused.state_dict(), plain.state_dict(), rtol=1e-3, atol=1e-4)
    # every call: per step, one attention and two RoPE (q, k) per layer, two RMSNorms per layer and the final one
    assert counts == {"sdpa": 3 * LAYERS, "rope": 3 * 2 * LAYERS, "rms_norm": 3 * (2 * LAYERS + 1)}
    assert not any("forward" in vars(m) for m in fused.modules()), "the modules' own forwards are back"
    assert modeling_llama.apply_rotary_pos_emb.__name__ == "apply_rotary_pos_emb"
    trainer = quiet_trainer(max_steps=1, callbacks=[FusedKernels()])
    trainer.fit(fused, _batches(1))
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    keys = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"].keys()
    assert list(keys) == list(CausalLM().state_dict().keys()), "checkpoints keep the model's own keys"


def test_bf16_mixed(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_seam(eager_hpu, monkeypatch)
    plain = _fit([], precision="bf16-mixed")
    fused = _fit([FusedKernels()], precision="bf16-mixed")
    # the first forward is the same; then the backward of the repeated kv heads (FusedSDPA has no grouped-query
    # flag) sums the groups' gradients in another order than torch's enable_gqa, within bfloat16's precision
    torch.testing.assert_close(fused.losses[0], plain.losses[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.stack(fused.losses), torch.stack(plain.losses), rtol=1.6e-2, atol=1e-5)
    assert (counts["sdpa"], counts["rms_norm"]) == (3 * LAYERS, 3 * (2 * LAYERS + 1))


@pytest.mark.skipif(
    tuple(int(part) for part in torch.__version__.split(".")[:2]) < (2, 8),
    reason="needs torch 2.8 or newer: torch 2.7's dynamo cannot trace transformers' deprecate_kwarg wrapper (a graph"
    " break without FusedKernels too)",
)
def test_compiled_without_graph_breaks(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fullgraph=True`` raises at any graph break; the seam is traced into the graphs."""
    torch.compiler.reset()
    counts = _count_seam(eager_hpu, monkeypatch)
    plain = _fit([HPUCompile(fullgraph=True)])
    fused = _fit([HPUCompile(fullgraph=True), FusedKernels()])
    torch.testing.assert_close(torch.stack(fused.losses), torch.stack(plain.losses))
    assert min(counts["sdpa"], counts["rope"] / 2) >= LAYERS, "traced into the graphs"
    assert counts["rms_norm"] >= 2 * LAYERS + 1
    torch.compiler.reset()


def _set_up(callback: FusedKernels, module: nn.Module) -> Precision:
    precision = Precision()
    holder = LightningModule()
    holder.model = module
    callback.setup(SimpleNamespace(strategy=SimpleNamespace(precision_plugin=precision)), holder, "fit")  # type: ignore[arg-type]
    return precision


@pytest.mark.parametrize("recompute", [True, False])
def test_bridge_kernels_are_called_with_their_arguments(bridge_double: ModuleType, recompute: bool) -> None:
    """The bridge path (tensors stay on the CPU: the double computes with torch)."""
    torch.manual_seed(0)
    model, ids = llama(), torch.randint(0, 128, (2, 12))
    expected = model(input_ids=ids, labels=ids).loss
    callback = FusedKernels(sdpa_recompute=recompute)
    with _set_up(callback, model).forward_context():
        loss = model(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(loss, expected)
    sdpa = bridge_double.called("hpex.FusedSDPA.apply")
    assert [c.kwargs["recompute_mode"] for c in sdpa] == [recompute] * LAYERS
    assert all(c.kwargs["is_causal"] and c.kwargs["attn_mask"] is None and c.kwargs["scale"] == 16**-0.5 for c in sdpa)
    norms = bridge_double.called("hpex.FusedRMSNorm.apply")
    assert [(c.kwargs["eps"], c.kwargs["dtype"]) for c in norms] == [(1e-6, torch.float32)] * (2 * LAYERS + 1)
    assert [c.kwargs["offset"] for c in bridge_double.called("hpex.RotaryPosEmbeddingHelperV1.apply")] == [0] * (
        2 * LAYERS
    )
    callback.teardown(None, None, "fit")  # type: ignore[arg-type]
    bridge_double.reset()
    model(input_ids=ids)
    assert not bridge_double.calls, "nothing is routed after teardown"


def test_what_the_kernels_cannot_take_runs_torch_said_once(bridge_double: ModuleType) -> None:
    torch.manual_seed(0)
    model, ids = llama().double(), torch.randint(0, 128, (2, 12))
    expected = model(input_ids=ids, labels=ids).loss
    callback = FusedKernels()
    precision = _set_up(callback, model)
    for _ in range(2):
        with precision.forward_context():
            loss = model(input_ids=ids, labels=ids).loss
        q = torch.randn(2, 4, 8, 16)
        with precision.forward_context():  # a 2-D mask: torch broadcasts it, FusedSDPA takes (N, ..., L or 1, S)
            out = F.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            callback._warn_fallbacks()
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q))
        assert not bridge_double.calls, "the double's kernels refuse float64: nothing reached them"
        if _ == 0:
            text = " | ".join(str(w.message) for w in caught)
            assert len(caught) == 4, text
            for part in ("attention in torch.float64", "RMSNorm in torch.float64", "rotary", "mask of shape (8, 8)"):
                assert part in text
        else:
            assert not caught, "said once"
    callback.teardown(None, None, "fit")  # type: ignore[arg-type]


def test_torch_rms_norm_modules(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    counts = _count_seam(eager_hpu, monkeypatch)
    net = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8), nn.RMSNorm([2, 4]))
    x = torch.randn(3, 8, 8)
    callback = FusedKernels()
    with _set_up(callback, net).forward_context():
        out = net[1](x)
        net[2](x.view(3, 8, 2, 4))  # over two dimensions: torch's
    torch.testing.assert_close(out, F.rms_norm(x, (8,), net[1].weight))
    assert counts == {"rms_norm": 1}
    assert callback._fallbacks == {"F.rms_norm without a weight, over several dimensions or in mixed or other dtypes"}


def test_by_class_path_on_the_command_line(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from test_cli import TINY

    from lightning_gaudi.cli import GaudiCLI

    monkeypatch.chdir(tmp_path)
    args = ["--trainer.callbacks+=lightning_gaudi.callbacks.FusedKernels", "--trainer.callbacks.sdpa_recompute=false"]
    saved = dict(os.environ)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cli = GaudiCLI(args=[*TINY, *args], run=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    (callback,) = [c for c in cli.trainer.callbacks if isinstance(c, FusedKernels)]
    assert (callback.sdpa, callback.sdpa_recompute) == (True, False)


@pytest.mark.parametrize("setting", [{"sdpa": "no"}, {"rope": 0}, {"rms_norm": None}, {"sdpa_recompute": "False"}])
def test_a_switch_that_is_not_a_bool_is_refused(setting: dict[str, Any]) -> None:
    """``FusedKernels(sdpa="no")`` counted as on: a switch takes ``True`` or ``False`` only."""
    name, value = next(iter(setting.items()))
    with pytest.raises(TypeError, match=rf"FusedKernels\({name}={value!r}\) must be True or False"):
        FusedKernels(**setting)


def test_an_invalid_grouped_query_head_count_keeps_torchs_error(eager_hpu: hpu.Backend) -> None:
    """6 query heads over 4 key-value heads: torch's own error, not a shape mismatch of repeated heads."""
    q, kv = torch.randn(1, 6, 4, 8), torch.randn(1, 4, 4, 8)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide") as plain:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    callback = FusedKernels()
    with (
        _set_up(callback, nn.Linear(2, 2)).forward_context(),
        pytest.raises(RuntimeError, match="Number of heads in key and value must divide") as routed,
    ):
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    assert str(routed.value) == str(plain.value)
    callback.teardown(None, None, "fit")  # type: ignore[arg-type]
