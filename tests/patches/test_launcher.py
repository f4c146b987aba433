"""Canary of ``lightning_gaudi.patches.launcher``: the check runs before Lightning's launcher starts a rank process,
and the launcher stays an instance of Lightning's class."""

from __future__ import annotations

from typing import Any

import pytest
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

from lightning_gaudi.patches import launcher


def test_the_check_runs_before_any_rank_process_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert launcher.installed()
    assert launcher.missing_targets() == []
    events: list[str] = []

    def start(self: _SubprocessScriptLauncher) -> None:
        events.append("started")
        raise InterruptedError  # where Lightning would start the other ranks

    monkeypatch.setattr(_SubprocessScriptLauncher, "_call_children_scripts", start)
    monkeypatch.setattr(LightningEnvironment, "validate_settings", lambda self, **kwargs: None)
    plain = _SubprocessScriptLauncher(LightningEnvironment(), 2, 1)

    def check(trainer: Any) -> None:
        events.append(f"checked {trainer}")
        if trainer == "bad":
            raise TypeError("refused")

    checked = launcher.checked_launcher(plain, check)
    assert isinstance(checked, _SubprocessScriptLauncher)
    assert (checked.num_processes, checked.num_nodes) == (2, 1)
    with pytest.raises(TypeError, match="refused"):
        checked.launch(lambda: None, trainer="bad")
    assert events == ["checked bad"]
    with pytest.raises(InterruptedError):
        checked.launch(lambda: None, trainer="good")
    assert events == ["checked bad", "checked good", "started"]
    assert launcher.checked_launcher(checked, check) is checked  # only Lightning's own class is turned
