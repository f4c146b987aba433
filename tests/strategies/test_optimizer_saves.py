"""Checkpoints of optimizers that keep no state (SGD without momentum) and of stateful ones, odd and even parameter
counts, saved and resumed under ``hpu_fsdp`` (full and sharded) by a real 2-process job (tests/helpers/
optimizer_saves.py's cases, run at the end of tests/strategies/test_fsdp_emulated.py's job). Lightning 2.6's
full-checkpoint resume failed on an optimizer without state (IndexError)."""

from __future__ import annotations

import json

import pytest

from strategies.test_fsdp_emulated import fsdp_job


@pytest.mark.subprocess
def test_fsdp_saves_and_resumes_stateless_and_stateful_optimizers_full_and_sharded(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = fsdp_job(tmp_path_factory) / "optimizer_saves"
    expected = {
        f"{strategy}/{optimizer}/odd": "ok"
        for strategy in ("hpu_fsdp", "hpu_fsdp_sharded_checkpoint")
        for optimizer in ("sgd", "adamw")
    }
    for rank in (0, 1):
        assert json.loads((out / f"rank{rank}.json").read_text()) == expected


def test_lightning_still_fails_on_an_optimizer_without_state() -> None:
    """Canary of ``HPUFSDPStrategy._load_full_checkpoint``: Lightning's re-keying of a full checkpoint's optimizer
    state reads the first key of its ``state``, which an optimizer without state (SGD without momentum) leaves empty.
    When this passes, Lightning handles it: the plugin's own full-checkpoint load can go."""
    from lightning.fabric.strategies.model_parallel import _rekey_optimizer_state_if_needed
    from torch import nn

    with pytest.raises(IndexError):
        _rekey_optimizer_state_if_needed({"state": {}, "param_groups": []}, nn.Linear(2, 2))
