"""Lightning's ``_SubprocessScriptLauncher`` (the Trainer's and Fabric's) as a subclass instance (:func:`hpu_launcher`):
it watches the rank processes it starts with the caller's ``watch`` in place of Lightning's ``_ChildProcessObserver``
(which SIGKILLs every process when one rank fails: a job that should end 143 ends -9), stops them with the caller's
``stop``, and runs a check of the Trainer (:func:`add_check`) before it starts them."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from lightning.fabric.strategies.launchers.subprocess_script import (
    _SubprocessScriptLauncher as _FabricLauncher,
)
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from typing_extensions import override

from lightning_gaudi.patches._checked import Checked

#: ``watch(procs, first_rank)``: watches the rank processes a launcher started; ``stop(signum)``: signals them.
Watch = Callable[[list[Any], int], None]
Stop = Callable[[int], None]

_STEPS = ("self._call_children_scripts()", "_launch_process_observer(self.procs)", "_set_num_threads_if_needed(")


def missing_targets() -> list[str]:
    """What the launchers rely on and this Lightning lacks or changed (empty when everything is as checked)."""
    missing = []
    for cls, parameter in ((_SubprocessScriptLauncher, "trainer"), (_FabricLauncher, "kwargs")):
        name = f"{cls.__module__}.{cls.__qualname__}"
        launch = cls.__dict__.get("launch")
        if not inspect.isfunction(launch) or parameter not in inspect.signature(launch).parameters:
            missing.append(f"{name}.launch(self, function, *args, {parameter}...)")
        else:
            missing += [f"{name}.launch -> {step}" for step in _STEPS if step not in inspect.getsource(launch)]
    return missing


_State = Checked(
    missing_targets,
    "Lightning's launcher watches the rank processes: a rank that fails ends every process with SIGKILL (the job's"
    " exit code is -9, not the rank's), and a LightningModule without configure_model under hpu_model_parallel is"
    " refused once the rank processes have started; everything else works.",
)
installed, install = _State.installed, _State.install
PATCH = _State.patch(
    "launcher",
    tuple(f"{cls.__module__}.{cls.__qualname__}.launch" for cls in (_SubprocessScriptLauncher, _FabricLauncher)),
)


def _start(launcher: Any) -> None:
    # what Lightning's `launch` does before it calls the function, with this package's watcher
    environment = launcher.cluster_environment
    environment.validate_settings(num_devices=launcher.num_processes, num_nodes=launcher.num_nodes)
    if not environment.creates_processes_externally:
        launcher._call_children_scripts()
        launcher.watch(launcher.procs, environment.node_rank() * launcher.num_processes + 1)
    _set_num_threads_if_needed(num_processes=launcher.num_processes)


class _HPULauncher(_SubprocessScriptLauncher):
    def __init__(self, launcher: _SubprocessScriptLauncher, watch: Watch, stop: Stop) -> None:
        super().__init__(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)
        self.watch, self.stop = watch, stop
        self.check: Callable[[Any], None] | None = None

    @override
    def launch(self, function: Callable, *args: Any, trainer: Any = None, **kwargs: Any) -> Any:
        if trainer is not None and self.check is not None:
            self.check(trainer)
        _start(self)
        return function(*args, **kwargs)

    @override
    def kill(self, signum: Any) -> None:
        self.stop(signum)


class _HPUFabricLauncher(_FabricLauncher):
    def __init__(self, launcher: _FabricLauncher, watch: Watch) -> None:
        super().__init__(launcher.cluster_environment, launcher.num_processes, launcher.num_nodes)
        self.watch = watch

    @override
    def launch(self, function: Callable, *args: Any, **kwargs: Any) -> Any:
        _start(self)
        return function(*args, **kwargs)


def hpu_launcher(launcher: Any, watch: Watch, stop: Stop) -> Any:
    """``launcher`` as one whose rank processes ``watch`` watches and ``stop`` signals (``launcher.kill``) when it is
    Lightning's launcher of local ranks and this Lightning was checked (:func:`install`); otherwise ``launcher``."""
    if not installed():
        return launcher
    if type(launcher) is _SubprocessScriptLauncher:
        return _HPULauncher(launcher, watch, stop)
    return _HPUFabricLauncher(launcher, watch) if type(launcher) is _FabricLauncher else launcher


def add_check(launcher: Any, check: Callable[[Any], None]) -> Any:
    """``launcher`` (from :func:`hpu_launcher`) running ``check(trainer)`` before it starts any process."""
    if isinstance(launcher, _HPULauncher):
        launcher.check = check
    return launcher
