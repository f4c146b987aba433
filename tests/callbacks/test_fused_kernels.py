"""fuse_kernels / FusedKernels: a Hugging Face LLaMA's attention, RMSNorm and RoPE through the seam (FusedSDPA,
FusedRMSNorm, FusedRoPE on the bridge double), for the Trainer and Fabric."""

from __future__ import annotations

import os
import warnings
from collections import Counter
from types import ModuleType
from typing import Any

import pytest
import torch
from helpers.workload import quiet_trainer
from lightning.pytorch import LightningModule, seed_everything
from torch import Tensor, nn
from torch.nn import functional as F

from lightning_gaudi import hpu
from lightning_gaudi.callbacks import FusedKernels, HPUCompile
from lightning_gaudi.kernels import FusedLlamaAttention, FusedRMSNorm, Kernels, fuse_kernels

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
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    counts = _count_seam(eager_hpu, monkeypatch)
    plain = _fit([])
    assert not counts
    with caplog.at_level("INFO"):
        fused = _fit([FusedKernels()])
    # the same math in another order of float operations (torch 2.7's kernels round one weight differently)
    torch.testing.assert_close(torch.stack(fused.losses), torch.stack(plain.losses), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(fused.state_dict(), plain.state_dict(), rtol=1e-3, atol=1e-4)
    # every call: per step, one attention and two RoPE (q, k) per layer, two RMSNorms per layer and the final one
    assert counts == {"sdpa": 3 * LAYERS, "rope": 3 * 2 * LAYERS, "rms_norm": 3 * (2 * LAYERS + 1)}
    summary = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Fused kernels:")]
    assert summary == ["Fused kernels: 2 x LlamaAttention -> FusedLlamaAttention, 5 x LlamaRMSNorm -> FusedRMSNorm."], (
        "one line at start-up"
    )
    assert modeling_llama.apply_rotary_pos_emb.__module__ == modeling_llama.__name__, "transformers is untouched"
    assert isinstance(fused.model.model.norm, FusedRMSNorm), "the replacement is visible on the model"
    trainer = quiet_trainer(max_steps=1, callbacks=[FusedKernels()])
    trainer.fit(fused, _batches(1))  # set up again: nothing left of a mapped type
    trainer.save_checkpoint(tmp_path / "last.ckpt")
    keys = torch.load(tmp_path / "last.ckpt", weights_only=False)["state_dict"].keys()
    assert list(keys) == list(CausalLM().state_dict().keys()), "checkpoints keep the model's own keys"


def test_fabric(eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    """Fabric's spelling: fuse_kernels before fabric.setup; the same losses as the plain model, every call routed."""
    from lightning.fabric import Fabric

    counts = _count_seam(eager_hpu, monkeypatch)
    losses: dict[bool, list[Tensor]] = {}
    for fused in (False, True):
        seed_everything(0, verbose=False)
        model = llama()
        if fused:
            fuse_kernels(model)
        fabric = Fabric(accelerator="hpu", devices=1)
        model, optimizer = fabric.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-2))
        losses[fused] = []
        for batch in _batches():
            loss = model(input_ids=fabric.to_device(batch), labels=fabric.to_device(batch)).loss
            fabric.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            losses[fused].append(loss.detach().cpu())
    torch.testing.assert_close(torch.stack(losses[True]), torch.stack(losses[False]), rtol=1e-4, atol=1e-5)
    assert counts == {"sdpa": 3 * LAYERS, "rope": 3 * 2 * LAYERS, "rms_norm": 3 * (2 * LAYERS + 1)}


@pytest.mark.parametrize("mask", [False, True])
def test_against_the_models_eager_attention(eager_hpu: hpu.Backend, mask: bool) -> None:
    """The reference is transformers' own eager attention (matmul, softmax, repeat_kv), not torch's SDPA, the seam's
    math in emulation: the fused model's logits and gradients equal the eager model's; with padding, a 4-D mask."""
    torch.manual_seed(0)
    eager = llama(attn_implementation="eager")
    fused = llama(attn_implementation="sdpa")
    fused.load_state_dict(eager.state_dict())
    report = fuse_kernels(fused)
    assert report.replaced == {"LlamaAttention -> FusedLlamaAttention": LAYERS, "LlamaRMSNorm -> FusedRMSNorm": 5}
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(ids)
    if mask:
        attention_mask[0, :4] = 0  # left padding
    keep = attention_mask.bool()
    labels = ids.clone()
    labels[0, :5] = -100 if mask else ids[0, :5]  # the padded positions attend to nothing: their logits not compared
    outputs = [m(input_ids=ids, attention_mask=attention_mask, labels=labels) for m in (eager, fused)]
    for out in outputs:
        out.loss.backward()
    torch.testing.assert_close(outputs[1].logits[keep], outputs[0].logits[keep], rtol=1e-4, atol=1e-5)
    grads = [dict((n, p.grad) for n, p in m.named_parameters()) for m in (eager, fused)]
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-3, atol=1e-5)


def test_a_fused_model_copies_and_pickles(eager_hpu: hpu.Backend) -> None:
    import copy
    import pickle

    torch.manual_seed(0)
    model, ids = llama(), torch.randint(0, 128, (2, 12))
    fuse_kernels(model)
    expected = model(input_ids=ids).logits
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert isinstance(other.model.norm, FusedRMSNorm)
        torch.testing.assert_close(other(input_ids=ids).logits, expected)


def test_generation_through_the_cache(eager_hpu: hpu.Backend) -> None:
    torch.manual_seed(0)
    model, ids = llama().eval(), torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(1))
    expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False)
    fuse_kernels(model)
    torch.testing.assert_close(
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False), expected
    )


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


@pytest.mark.parametrize("recompute", [True, False])
def test_bridge_kernels_are_called_with_their_arguments(bridge_double: ModuleType, recompute: bool) -> None:
    """The bridge path (tensors stay on the CPU: the double computes with torch)."""
    torch.manual_seed(0)
    model, ids = llama(), torch.randint(0, 128, (2, 12))
    expected = model(input_ids=ids, labels=ids).loss
    fuse_kernels(model, sdpa_recompute=recompute)
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


def test_what_the_kernels_cannot_take_runs_torch_said_once(bridge_double: ModuleType) -> None:
    torch.manual_seed(0)
    model, ids = llama().double(), torch.randint(0, 128, (2, 12))
    expected = model(input_ids=ids, labels=ids).loss
    kernels = fuse_kernels(model).kernels
    for _ in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = model(input_ids=ids, labels=ids).loss
            q = torch.randn(2, 4, 8, 16)  # a 2-D mask: torch broadcasts it, FusedSDPA takes (N, ..., L or 1, S)
            out = kernels.sdpa(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.bool))
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


def test_torch_rms_norm_modules_and_a_mapping_of_ones_own(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _count_seam(eager_hpu, monkeypatch)

    class Attention(nn.Module):  # a user's module, mapped explicitly
        def forward(self, q: Tensor) -> Tensor:
            return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    class Fused(nn.Module):
        def __init__(self, kernels: Kernels) -> None:
            super().__init__()
            self.kernels = (kernels,)

        def forward(self, q: Tensor) -> Tensor:
            return self.kernels[0].sdpa(q, q, q, is_causal=True)

    net = nn.Sequential(nn.Linear(8, 8), nn.RMSNorm(8), nn.RMSNorm([2, 4]), nn.RMSNorm(8, elementwise_affine=False))
    x = torch.randn(3, 8, 8)
    expected = net[1](x)
    report = fuse_kernels(net)
    assert report.replaced == {"RMSNorm -> FusedRMSNorm": 1}, "over two dimensions or without a weight: torch's"
    torch.testing.assert_close(net[1](x), expected)
    assert counts == {"rms_norm": 1}
    holder = nn.Sequential(Attention())
    q = torch.randn(2, 4, 8, 16)
    report = fuse_kernels(holder, {Attention: lambda module, kernels: Fused(kernels)})
    assert report.summary() == "Fused kernels: 1 x Attention -> Fused."
    torch.testing.assert_close(holder(q), Attention()(q))
    assert counts["sdpa"] == 1
    assert fuse_kernels(nn.Linear(2, 2)).summary().endswith("no module of a mapped type; the model is unchanged.")


@pytest.mark.parametrize("setting", [{"sdpa": "no"}, {"rope": 0}, {"rms_norm": None}, {"sdpa_recompute": "False"}])
def test_a_switch_that_is_not_a_bool_is_refused(setting: dict[str, Any]) -> None:
    """``FusedKernels(sdpa="no")`` counted as on: a switch takes ``True`` or ``False`` only."""
    name, value = next(iter(setting.items()))
    with pytest.raises(TypeError, match=rf"FusedKernels\({name}={value!r}\) must be True or False"):
        FusedKernels(**setting)
    with pytest.raises(TypeError, match=rf"FusedKernels\({name}={value!r}\) must be True or False"):
        fuse_kernels(nn.Linear(2, 2), **setting)


def test_an_invalid_grouped_query_head_count_keeps_torchs_error(eager_hpu: hpu.Backend) -> None:
    """6 query heads over 4 key-value heads: torch's own error, not a shape mismatch of repeated heads."""
    q, kv = torch.randn(1, 6, 4, 8), torch.randn(1, 4, 4, 8)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide") as plain:
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
    with pytest.raises(RuntimeError, match="Number of heads in key and value must divide") as routed:
        Kernels().sdpa(q, kv, kv)
    assert str(routed.value) == str(plain.value)


def test_bad_input(eager_hpu: hpu.Backend) -> None:
    with pytest.raises(TypeError, match=r"keys are nn\.Module types, got 'RMSNorm'"):
        fuse_kernels(nn.Linear(2, 2), {"RMSNorm": FusedRMSNorm.from_module})  # type: ignore[dict-item]
    assert fuse_kernels(llama(), rms_norm=False, sdpa=False, rope=False).replaced == {}
    attention = fuse_kernels(llama(), rms_norm=False, rope=False)
    assert attention.replaced == {"LlamaAttention -> FusedLlamaAttention": LAYERS}
    assert FusedLlamaAttention  # imported for the type


def test_by_class_path_on_the_command_line(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from test_cli import TINY

    from lightning_gaudi.app.cli import GaudiCLI

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
