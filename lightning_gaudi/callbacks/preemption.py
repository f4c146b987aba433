"""Preemption: on SIGTERM all ranks stop at the same step, a checkpoint is saved, and all exit within a grace period."""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import shutil
import signal
import threading
import uuid
from collections.abc import Sequence
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, Checkpoint
from lightning.pytorch.utilities.exceptions import SIGTERMException
from typing_extensions import override

from lightning_gaudi.distributed.agreement import StopVote
from lightning_gaudi.distributed.rendezvous import DEFAULT_TIMEOUT
from lightning_gaudi.distributed.shutdown import cleanup_on_abort, end_job
from lightning_gaudi.patches import signals as signal_patch

log = logging.getLogger(__name__)

#: Seconds from the signal to the exit: under the 30 s SLURM, Kubernetes and torchrun wait before they kill.
DEFAULT_GRACE_PERIOD = 25.0
#: The preemption checkpoint's file name (without ``.ckpt``); ``last`` first so that ``ckpt_path="last"`` finds it.
PREEMPTION_CHECKPOINT_NAME = "last-preempted"
_UNCATCHABLE = {signal.SIGKILL, signal.SIGSTOP}


def preempted_exit_code(signum: int) -> int:
    """The exit code of a process stopped by signal ``signum`` (the shell's convention: 143 for SIGTERM)."""
    return 128 + int(signum)


class Preempted(SIGTERMException):
    """Ends ``Trainer.fit`` on every rank after a preemption: a ``SystemExit`` with :func:`preempted_exit_code`, so a
    scheduler sees a failed job and requeues it. ``checkpoint`` is where it was saved (``None``: nowhere)."""

    def __init__(self, signum: int, checkpoint: str | None) -> None:
        super().__init__(preempted_exit_code(signum))
        self.signum = signum
        self.checkpoint = checkpoint


def _parse_signal(value: str | int) -> signal.Signals:
    try:
        name = value.strip().upper() if isinstance(value, str) else None
        sig = signal.Signals(int(value)) if name is None else signal.Signals["SIG" + name.removeprefix("SIG")]
    except (KeyError, ValueError):
        raise ValueError(f"PreemptionCheckpoint got {value!r}, which is not a signal: pass e.g. 'SIGTERM'.") from None
    if sig in _UNCATCHABLE:
        raise ValueError(f"PreemptionCheckpoint cannot handle {sig.name}: no process can catch it. Pass 'SIGTERM'.")
    return sig


class PreemptionCheckpoint(Callback):
    """On SIGTERM, every rank stops at the same optimizer step (agreed in a background vote), saves
    ``<dirpath>/last-preempted.ckpt`` and raises :class:`Preempted` (exit 143), all within ``grace_period`` seconds.

    Args:
        grace_period: seconds from the signal to the exit: below the scheduler's kill delay, above a step plus a save.
        dirpath, filename: where to save (default: the ``ModelCheckpoint``'s folder) and the name without ``.ckpt``.
        signals: the signals that preempt, by name; add ``"SIGUSR1"`` for SLURM's ``--signal=USR1@<seconds>``.
        enabled: ``False`` turns it off (no default one either): SIGTERM then ends every rank without a checkpoint.
    """

    def __init__(
        self,
        grace_period: float = DEFAULT_GRACE_PERIOD,
        dirpath: str | None = None,
        filename: str = PREEMPTION_CHECKPOINT_NAME,
        signals: Sequence[str] = ("SIGTERM",),
        enabled: bool = True,
    ) -> None:
        number = isinstance(grace_period, int | float) and not isinstance(grace_period, bool)
        if not number or not math.isfinite(grace_period) or grace_period <= 0:
            raise ValueError(
                f"PreemptionCheckpoint(grace_period={grace_period!r}) must be a positive, finite number of seconds."
            )
        if not filename or "/" in filename or os.sep in filename:
            raise ValueError(
                f"PreemptionCheckpoint(filename={filename!r}) must be a file name without a folder (see dirpath)."
            )
        listed = [signals] if isinstance(signals, str | int) else signals
        parsed = tuple(dict.fromkeys(_parse_signal(s) for s in listed))
        if not parsed:
            raise ValueError("PreemptionCheckpoint(signals=()) handles nothing: pass ['SIGTERM'] or enabled=False.")
        self.grace_period, self.dirpath, self.filename = float(grace_period), dirpath, filename
        self.signals, self.enabled = parsed, enabled
        self._trainer: pl.Trainer | None = None
        self._vote: StopVote | None = None
        self._requested = 0  # the first signal this rank received
        self._agreed = 0  # the signal every rank agreed to stop for
        self._timer: threading.Timer | None = None
        self._took_sigterm = False
        self._saving: str | None = None

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self._trainer = trainer
        if self.enabled:
            self._requested = self._agreed = 0
            # a signal reaches every rank within a quarter of the grace period; the rest is for the step and the save
            self._vote = StopVote(getattr(trainer.strategy, "timeout", DEFAULT_TIMEOUT), latency=self.grace_period / 4)
            # one name per vote, the same on every rank (torchrun's restart count may differ between nodes)
            self._vote.setup(trainer.strategy.broadcast(uuid.uuid4().hex))
        if signal.SIGTERM in self.signals:
            # the handler Lightning registers after setup; disabled, SIGTERM ends the ranks without Lightning's
            # per-batch broadcast (a blocking collective)
            handler = self._on_signal if self.enabled else self._end
            self._took_sigterm = signal_patch.take_over_sigterm(trainer, handler)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._vote is None or threading.current_thread() is not threading.main_thread():
            return
        # after Lightning registered its handlers (it restores the ones from before the fit when the fit ends)
        for sig in self.signals:
            if sig != signal.SIGTERM:
                signal.signal(sig, self._on_signal)

    @property
    def checkpoint_path(self) -> str | None:
        """Where the checkpoint is saved (known once the fit has set up), or ``None``."""
        callback = self._trainer.checkpoint_callback if self._trainer is not None else None
        dirpath = self.dirpath or getattr(callback, "dirpath", None)
        if dirpath is None:
            return None
        name = f"{self.filename}.ckpt"
        text = os.fspath(dirpath)
        return f"{text.rstrip('/')}/{name}" if "://" in text else os.path.join(text, name)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._requested:
            return
        self._requested = signum
        self._arm(signum)
        rank, name = self._trainer.global_rank if self._trainer is not None else 0, signal.Signals(signum).name
        log.warning(
            f"[rank {rank}] lightning_gaudi: received {name}; all ranks save and stop in {self.grace_period:g}s"
        )
        self._kill_launched(signum)  # so that each rank this process started bounds its own exit

    def _end(self, signum: int, frame: Any) -> None:
        self._kill_launched(signum)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def _kill_launched(self, signum: int) -> None:
        launcher = self._trainer.strategy.launcher if self._trainer is not None else None
        if launcher is not None:
            launcher.kill(signum)

    def _arm(self, signum: int) -> None:
        if self._timer is None:
            self._timer = threading.Timer(self.grace_period, self._expire, args=(signum,))
            self._timer.daemon = True
            self._timer.start()

    def _expire(self, signum: int) -> None:
        saving = self._saving
        self._kill_launched(signal.SIGKILL)  # a launcher that is not this package's (end_job stops the ranks it saw)
        end_job(  # removes the temporaries of a save in progress (_stop)
            preempted_exit_code(signum),
            f"lightning_gaudi: the preemption grace period of {self.grace_period:g}s ran out"
            f" {'while saving ' + saving if saving else 'before the ranks could stop together'}; exiting with code"
            f" {preempted_exit_code(signum)} without a checkpoint from this preemption.",
        )

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self._vote is None:
            return
        if not self._agreed:
            self._agreed = self._vote.step(self._requested)
        if self._agreed and ((batch_idx + 1) % trainer.accumulate_grad_batches == 0 or trainer.is_last_batch):
            self._stop(trainer, self._agreed)

    def _stop(self, trainer: pl.Trainer, signum: int) -> None:
        self._arm(signum)  # a rank that learned of the signal from the vote
        path = self.checkpoint_path
        saved = "without a checkpoint (no ModelCheckpoint, no dirpath)"
        if path is not None:
            self._saving = path
            with cleanup_on_abort(lambda: _remove_own_temporaries(path)):
                trainer.save_checkpoint(path, weights_only=False)
            self._saving, saved = None, f"saved {path}"
        if trainer.is_global_zero:
            name, code = signal.Signals(signum).name, preempted_exit_code(signum)
            log.warning(
                f"lightning_gaudi: preempted by {name}: {saved} at step {trainer.global_step}; exit code {code}"
            )
        signal_patch.exit_on_repeat(trainer, self.signals, preempted_exit_code(signum))
        raise Preempted(signum, path)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._vote is not None:
            self._vote.close()
            self._vote = None
        if self._took_sigterm:
            signal_patch.release_sigterm(trainer)
            self._took_sigterm = False

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "fit")  # a peer may never vote again; an armed timer still bounds the exit


def _remove_own_temporaries(path: str) -> None:
    if "://" in path:
        return  # a remote store's temporary is removed by the next save, as a stale one
    directory, name = os.path.split(path)
    for tmp in glob.glob(os.path.join(glob.escape(directory), f".{glob.escape(name)}*-{os.getpid()}-*.tmp")):
        with contextlib.suppress(OSError):
            if os.path.isdir(tmp) and not os.path.islink(tmp):
                shutil.rmtree(tmp)  # a sharded save's staging folder, named for rank 0
            else:
                os.unlink(tmp)


def add_default_preemption(trainer: pl.Trainer) -> PreemptionCheckpoint | None:
    """Adds a default :class:`PreemptionCheckpoint` to ``trainer.callbacks`` unless one is configured; returns it."""
    callbacks: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]
    if any(isinstance(c, PreemptionCheckpoint) for c in callbacks):
        return None
    callback = PreemptionCheckpoint()
    # before the checkpoint callbacks, which Lightning keeps last
    first_checkpoint = next((i for i, c in enumerate(callbacks) if isinstance(c, Checkpoint)), len(callbacks))
    callbacks.insert(first_checkpoint, callback)
    return callback
