"""Canary of ``lightning_gaudi.patches.launcher``: Lightning's launchers (the Trainer's and Fabric's) run the check
before they start a rank process, watch the ranks with this package's watcher in place of Lightning's observer, and
stay instances of Lightning's classes."""

from __future__ import annotations

from typing import Any

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.strategies.launchers import subprocess_script as fabric_script
from lightning.pytorch.strategies.launchers import subprocess_script as trainer_script

from lightning_gaudi.distributed import shutdown
from lightning_gaudi.patches import launcher


def test_the_check_runs_before_any_rank_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher.installed()
    assert launcher.missing_targets() == []
    events: list[str] = []

    def start(self: Any) -> None:
        events.append("started")
        raise InterruptedError  # where Lightning would start the other ranks

    monkeypatch.setattr(trainer_script._SubprocessScriptLauncher, "_call_children_scripts", start)
    monkeypatch.setattr(LightningEnvironment, "validate_settings", lambda self, **kwargs: None)
    plain = trainer_script._SubprocessScriptLauncher(LightningEnvironment(), 2, 1)

    def check(trainer: Any) -> None:
        events.append(f"checked {trainer}")
        if trainer == "bad":
            raise TypeError("refused")

    checked = launcher.add_check(launcher.hpu_launcher(plain, shutdown.watch_ranks, shutdown.stop_ranks), check)
    assert isinstance(checked, trainer_script._SubprocessScriptLauncher)
    assert (checked.num_processes, checked.num_nodes) == (2, 1)
    with pytest.raises(TypeError, match="refused"):
        checked.launch(lambda: None, trainer="bad")
    assert events == ["checked bad"]
    with pytest.raises(InterruptedError):
        checked.launch(lambda: None, trainer="good")
    assert events == ["checked bad", "checked good", "started"]
    assert launcher.hpu_launcher(checked, shutdown.watch_ranks, shutdown.stop_ranks) is checked  # Lightning's only
    assert launcher.add_check(plain, check) is plain


@pytest.mark.parametrize("script", [trainer_script, fabric_script])
def test_the_ranks_are_watched_by_this_package_not_by_lightning(monkeypatch: pytest.MonkeyPatch, script: Any) -> None:
    """Lightning's observer SIGKILLs every process when a rank ends non-zero; the watcher ends the job with that
    rank's exit code."""
    watched: list[tuple[Any, int]] = []
    monkeypatch.setattr(script._SubprocessScriptLauncher, "_call_children_scripts", lambda self: None)
    monkeypatch.setattr(script, "_launch_process_observer", lambda procs: pytest.fail("Lightning's observer ran"))
    monkeypatch.setattr(LightningEnvironment, "validate_settings", lambda self, **kwargs: None)
    monkeypatch.setenv("NODE_RANK", "1")  # the second node's local ranks 1, 2 are global ranks 4, 5
    plain = script._SubprocessScriptLauncher(LightningEnvironment(), 3, 2)
    stopped: list[int] = []
    hpu = launcher.hpu_launcher(plain, lambda procs, first_rank: watched.append((procs, first_rank)), stopped.append)
    assert isinstance(hpu, script._SubprocessScriptLauncher)
    assert type(hpu) is not type(plain)
    assert hpu.launch(lambda x: x + 1, 1) == 2
    assert watched == [(hpu.procs, 4)]
    if script is trainer_script:  # the Trainer asks its launcher to kill the ranks when a run fails or is interrupted
        hpu.kill(9)
        assert stopped == [9]
