"""A check of the Trainer before Lightning's ``_SubprocessScriptLauncher`` starts the other ranks
(:func:`checked_launcher`, a subclass instance); nothing is patched globally."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from typing_extensions import override

from lightning_gaudi.patches._checked import Checked

_CLASS = f"{_SubprocessScriptLauncher.__module__}.{_SubprocessScriptLauncher.__qualname__}"


def missing_targets() -> list[str]:
    """What the check relies on and this Lightning lacks or changed (empty when everything is as checked)."""
    launch = _SubprocessScriptLauncher.__dict__.get("launch")
    if not inspect.isfunction(launch) or "trainer" not in inspect.signature(launch).parameters:
        return [f"{_CLASS}.launch(self, function, *args, trainer=None, **kwargs)"]
    if "self._call_children_scripts()" not in inspect.getsource(launch):
        return [f"{_CLASS}.launch -> self._call_children_scripts()"]
    return []


_State = Checked(
    missing_targets,
    "A LightningModule without configure_model under hpu_model_parallel is refused by Lightning once the rank"
    " processes have started, instead of before; everything else works.",
)
installed, install = _State.installed, _State.install
PATCH = _State.patch("launcher", (f"{_CLASS}.launch", f"{_CLASS}._call_children_scripts"))


class _CheckedLauncher(_SubprocessScriptLauncher):
    def __init__(self, check: Callable[[Any], None], launcher: _SubprocessScriptLauncher) -> None:
        super().__init__(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)
        self.check = check

    @override
    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if trainer is not None:
            self.check(trainer)
        return super().launch(function, *args, trainer=trainer, **kwargs)


def checked_launcher(launcher: Any, check: Callable[[Any], None]) -> Any:
    """``launcher`` as one that runs ``check(trainer)`` before it starts any process, when it is Lightning's launcher
    of local ranks and this Lightning was checked (:func:`install`); otherwise ``launcher`` itself."""
    if type(launcher) is not _SubprocessScriptLauncher or not installed():
        return launcher
    return _CheckedLauncher(check, launcher)
