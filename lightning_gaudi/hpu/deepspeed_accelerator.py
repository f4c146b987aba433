"""DeepSpeed's accelerator for the HPU backend, chosen before DeepSpeed is imported (it reads ``DS_ACCELERATOR`` once
per process)."""

from __future__ import annotations

import os
import sys

from lightning_gaudi.hpu.backend import Backend

#: The variable DeepSpeed reads, once, to pick its accelerator.
DS_ACCELERATOR_ENV = "DS_ACCELERATOR"
#: How Gaudi users install DeepSpeed (Intel's fork matching the Gaudi software).
INTEL_FORK_INSTALL = "pip install git+https://github.com/HabanaAI/DeepSpeed.git@<Gaudi software version, e.g. 1.23.0>"
#: How developers and CI install it (public DeepSpeed, with the CPU accelerator; no ops are compiled).
EXTRA_INSTALL = "DS_BUILD_OPS=0 pip install --no-build-isolation 'lightning-gaudi[deepspeed]'"
#: The local-version marker of Intel's fork (``0.16.1+hpu.synapse.v1.22.0``).
INTEL_FORK_MARKER = "+hpu.synapse"


class DeepSpeedMissingError(ImportError):
    """DeepSpeed is not installed (or cannot drive this HPU backend)."""


def deepspeed_accelerator_name(backend: Backend) -> str:
    """The DeepSpeed accelerator for ``backend``: ``"hpu"`` on a Gaudi, ``"cpu"`` in eager emulation (lazy: none)."""
    if not backend.emulated:
        return "hpu"
    if backend.is_lazy():
        raise ValueError(
            "DeepSpeed cannot run under lazy emulation (LIGHTNING_GAUDI_EMULATE=lazy): it has no accelerator for"
            " torch's Lazy Tensor Core, whose tensors cannot cross gloo collectives. Emulate it with"
            " LIGHTNING_GAUDI_EMULATE=eager."
        )
    return "cpu"


def _install(backend: Backend) -> str:
    return f"`{EXTRA_INSTALL}`" if backend.emulated else f"Intel's DeepSpeed fork for Gaudi, `{INTEL_FORK_INSTALL}`"


def missing_deepspeed_message(backend: Backend, what: str) -> str:
    """How to install DeepSpeed for ``backend``, after ``what`` needs it."""
    return f"{what} needs DeepSpeed, which is not installed. Install {_install(backend)}."


def _cannot_drive(wanted: str, error: BaseException, backend: Backend, what: str) -> str:
    return (
        f"The installed DeepSpeed cannot drive its {wanted!r} accelerator ({type(error).__name__}: {error}), which"
        f" {what} needs. Install {_install(backend)}."
    )


def select_deepspeed_accelerator(backend: Backend, what: str) -> str:
    """Sets ``DS_ACCELERATOR`` for ``backend``, imports DeepSpeed and checks its choice; returns the accelerator's name.
    Raises ``ValueError``, :class:`DeepSpeedMissingError` or ``RuntimeError`` (DeepSpeed chose another one)."""
    wanted = deepspeed_accelerator_name(backend)
    chosen = os.environ.get(DS_ACCELERATOR_ENV)
    if chosen is not None and chosen != wanted:
        raise ValueError(
            f"{DS_ACCELERATOR_ENV}={chosen!r}, but {what} on {'the emulated HPU' if backend.emulated else 'a Gaudi'}"
            f" needs DeepSpeed's {wanted!r} accelerator. Unset {DS_ACCELERATOR_ENV} (or set it to {wanted!r})."
        )
    imported_before = "deepspeed" in sys.modules
    os.environ[DS_ACCELERATOR_ENV] = wanted
    try:
        from deepspeed.accelerator import get_accelerator
    except ImportError as err:
        if err.name is not None and err.name.split(".")[0] != "deepspeed":
            raise  # DeepSpeed is there but one of its own imports failed: its message says which
        raise DeepSpeedMissingError(missing_deepspeed_message(backend, what)) from err
    except Exception as err:  # DeepSpeed's import sets its accelerator up; an HPU one fails on a bridge it cannot use
        raise DeepSpeedMissingError(_cannot_drive(wanted, err, backend, what)) from err
    try:
        accelerator = get_accelerator()
    except ValueError as err:  # DeepSpeed refuses an accelerator it does not know, or one whose package is missing
        raise DeepSpeedMissingError(_cannot_drive(wanted, err, backend, what)) from err
    found = accelerator.device_name()
    if found != wanted:
        subject = "DeepSpeed, imported before lightning_gaudi could choose," if imported_before else "DeepSpeed"
        raise RuntimeError(
            f"{subject} uses its {found!r} accelerator, but {what} needs {wanted!r}: DeepSpeed picks it once per"
            f" process. Set {DS_ACCELERATOR_ENV}={wanted} before importing deepspeed, or create the strategy before"
            " anything imports deepspeed."
        )
    return found


def is_intel_fork(version: str) -> bool:
    """Whether a DeepSpeed ``version`` string is Intel's Gaudi fork's (``0.16.1+hpu.synapse.v1.22.0``)."""
    return INTEL_FORK_MARKER in version
