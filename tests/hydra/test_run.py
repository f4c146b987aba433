"""``lightning_gaudi.app.hydra.run``: bad strategy arguments stop a multi-card job before any rank process starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpt_recipe import task
from helpers.configs import compose_train

import lightning_gaudi.app.hydra as lg_hydra
from lightning_gaudi import hpu
from lightning_gaudi.app.hydra import ranks


def test_a_strategy_typo_stops_the_job_before_any_rank_starts(isolated_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    started: list[list[str]] = []
    isolated_env.setattr(ranks, "launch_local_ranks", lambda command, *args, **kwargs: started.append(command))
    cfg = compose_train(
        ["strategy=hpu_parallel", "trainer.devices=2", "+strategy.bucket_cap_mbb=3"], output_dir=tmp_path
    )
    with pytest.raises(Exception, match="bucket_cap_mb") as info:
        lg_hydra.run(cfg, task.train)
    assert "Did you mean" in str(info.value) or "Did you mean" in str(info.value.__cause__)
    assert started == []
    assert not (tmp_path / ranks.RANK_CONFIG_FILE).exists()


def test_testing_with_fp8_quantize_and_no_measurements_stops_before_training(
    isolated_env: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``test=true`` with ``FP8Inference`` quantizing from a path without measurements: refused before the fit (the
    test after it would refuse them)."""
    isolated_env.setenv(hpu.EMULATE_ENV, "eager")
    stats = tmp_path / "nothing" / "measure"
    overrides = ["callbacks=[default,fp8_inference]", f"callbacks.fp8_inference.stats_path={stats}"]
    trained: list[object] = []
    with pytest.raises(FileNotFoundError, match=rf"no measurements at stats_path='{stats}'.*mode='measure'"):
        lg_hydra.run(compose_train([*overrides, "test=true"], output_dir=tmp_path), trained.append)
    assert trained == []
    lg_hydra.run(compose_train(overrides, output_dir=tmp_path), trained.append)  # no test: fit alone ignores it
    assert len(trained) == 1
