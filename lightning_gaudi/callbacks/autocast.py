"""Custom bf16 autocast op lists: Gaudi's list files, really applied under emulation."""

from __future__ import annotations

import difflib
import functools
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.precision import MixedPrecision
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map
from typing_extensions import override

from lightning_gaudi import hpu

#: The bridge's variables for the list files (read once, when the bridge loads).
BF16_LIST_ENV = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_LIST_ENV = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: The names older bridges read.
LEGACY_ENV = {BF16_LIST_ENV: "LOWER_LIST", FP32_LIST_ENV: "FP32_LIST"}

# Gaudi's lists name Python operators the way optimum-habana's do ("iadd", "truediv", "rsub")
_PYTHON_OPERATORS = frozenset(
    f"{prefix}{name}"
    for name in ("add", "sub", "mul", "div", "truediv", "floordiv", "matmul", "pow", "mod")
    for prefix in ("", "i", "r")
)


@functools.cache
def known_op_names() -> frozenset[str]:
    """Op names a list may hold: every ``aten`` op, the functional API and Python's arithmetic operators."""
    aten = {name.split("::", 1)[1].split(".", 1)[0] for name in torch._C._dispatch_get_all_op_names() if "::" in name}
    functional = {name for name in dir(torch.nn.functional) if not name.startswith("_")}
    return frozenset(aten | functional | _PYTHON_OPERATORS)


def _check_ops(argument: str, ops: Iterable[str] | None) -> tuple[str, ...] | None:
    if ops is None:
        return None
    if isinstance(ops, str):
        raise TypeError(f"`{argument}={ops!r}` must be a list of op names, e.g. [{ops!r}], not a string.")
    names = tuple(ops)
    known = known_op_names()
    for name in names:
        if not isinstance(name, str) or name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
            raise ValueError(
                f"`{argument}` holds {name!r}, which is not a PyTorch op name (aten ops like 'linear', 'softmax',"
                f" 'nll_loss', or Python operators like 'iadd', 'truediv').{hint}"
            )
    return names


def _op_name(func: Callable[..., Any]) -> str:
    return getattr(func, "__name__", "").strip("_")


class OpListMode(TorchFunctionMode):
    """Runs listed ops in a fixed dtype inside autocast: the emulation of Gaudi's autocast list files.

    Floating inputs of an op named in ``fp32_ops`` are cast to float32 and those of one in ``bf16_ops`` to bfloat16,
    and the op runs with autocast off, so its output has that dtype. Other ops follow the device's autocast policy.
    """

    def __init__(self, device_type: str, bf16_ops: Iterable[str], fp32_ops: Iterable[str]) -> None:
        super().__init__()
        self.device_type = device_type
        self.dtypes = {name: torch.bfloat16 for name in bf16_ops} | {name: torch.float32 for name in fp32_ops}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        dtype = self.dtypes.get(_op_name(func))
        if dtype is None or not torch.is_autocast_enabled(self.device_type):
            return func(*args, **kwargs)

        def cast(value: Any) -> Any:
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
                return value.to(dtype)
            return value

        with torch.autocast(self.device_type, enabled=False):
            return func(*tree_map(cast, args), **tree_map(cast, kwargs))


class BF16Autocast(Callback):
    """Chooses which ops run in bfloat16 and which stay in float32 under ``precision="bf16-mixed"``.

    On Gaudi the lists go to files named by ``PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST`` and
    ``PT_HPU_AUTOCAST_FP32_OPS_LIST`` (and the older ``LOWER_LIST`` / ``FP32_LIST``), which the bridge reads when it
    loads: construct this callback before the Trainer (before anything imports ``habana_frameworks``). Under eager
    emulation the lists are applied to CPU autocast by :class:`OpListMode`; lazy emulation has no autocast.

    Defaults: a list left as ``None`` keeps the device's own policy (the bridge's built-in list on Gaudi, torch's
    CPU autocast policy under emulation). On Gaudi a list you give replaces the bridge's list; under emulation ops
    named in neither list follow torch's CPU autocast policy.

    Args:
        bf16_ops: op names to run in bfloat16, e.g. ``["linear", "matmul", "gelu"]``.
        fp32_ops: op names to keep in float32, e.g. ``["softmax", "log_softmax", "nll_loss"]``.
        list_dir: where the list files are written on Gaudi (a new temporary directory when ``None``).

    Raises:
        ValueError: an unknown op name (with close matches), or an op in both lists.
        RuntimeError: on Gaudi, the bridge was loaded before the lists could be set.
    """

    def __init__(
        self,
        bf16_ops: Iterable[str] | None = None,
        fp32_ops: Iterable[str] | None = None,
        list_dir: str | Path | None = None,
    ) -> None:
        self.bf16_ops = _check_ops("bf16_ops", bf16_ops)
        self.fp32_ops = _check_ops("fp32_ops", fp32_ops)
        both = sorted(set(self.bf16_ops or ()) & set(self.fp32_ops or ()))
        if both:
            raise ValueError(f"{both} are in both `bf16_ops` and `fp32_ops`; name each op in one list only.")
        self.list_files: dict[str, Path] = {}
        self._plugin: MixedPrecision | None = None
        if hpu.emulation_mode() is None:
            self.list_files = self._write_bridge_lists(list_dir)

    def _write_bridge_lists(self, list_dir: str | Path | None) -> dict[str, Path]:
        given = {BF16_LIST_ENV: self.bf16_ops, FP32_LIST_ENV: self.fp32_ops}
        lists = {env: ops for env, ops in given.items() if ops is not None}
        if not lists:
            return {}
        if hpu.bridge_loaded():
            wanted = {env: "\n".join(ops) for env, ops in lists.items()}
            current = {env: _read(os.environ.get(env)) for env in lists}
            if current == wanted:
                return {env: Path(os.environ[env]) for env in lists}
            raise RuntimeError(
                "BF16Autocast must set the bridge's autocast lists before the bridge loads, but habana_frameworks"
                " is already imported. Construct BF16Autocast before the Trainer and before importing"
                f" habana_frameworks, or export {', '.join(lists)} (files with one op name a line) before starting"
                " Python."
            )
        directory = Path(list_dir) if list_dir is not None else Path(tempfile.mkdtemp(prefix="lightning_gaudi_"))
        directory.mkdir(parents=True, exist_ok=True)
        files = {}
        for env, ops in lists.items():
            path = directory / ("autocast_bf16_ops.txt" if env == BF16_LIST_ENV else "autocast_fp32_ops.txt")
            path.write_text("\n".join(ops) + "\n")
            os.environ[env] = os.environ[LEGACY_ENV[env]] = str(path)
            files[env] = path
        return files

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        plugin = trainer.precision_plugin
        if not isinstance(plugin, MixedPrecision) or plugin.precision != "bf16-mixed":
            raise ValueError(
                f"BF16Autocast needs `Trainer(precision='bf16-mixed')`; this Trainer runs"
                f" precision={getattr(plugin, 'precision', type(plugin).__name__)!r}."
            )
        backend = hpu.get_backend()
        if not backend.emulated or (self.bf16_ops is None and self.fp32_ops is None):
            return  # the bridge applies its lists itself
        original = plugin.autocast_context_manager
        op_lists = OpListMode(plugin.device, self.bf16_ops or (), self.fp32_ops or ())  # built once, entered per step

        @contextmanager
        def with_op_lists() -> Iterator[None]:
            with original(), op_lists:
                yield

        plugin.autocast_context_manager = with_op_lists  # type: ignore[method-assign,assignment]
        self._plugin = plugin

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._plugin is not None:
            del self._plugin.autocast_context_manager  # back to the class's method
            self._plugin = None


def _read(path: str | None) -> str | None:
    if not path or not os.path.isfile(path):
        return None
    return Path(path).read_text().strip()
