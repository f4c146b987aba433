"""Autocast op lists: op-name validation and the list files Intel's bridge reads when it loads."""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable
from pathlib import Path

import torch

#: The bridge's variables naming the list files (read once, when the bridge loads).
BF16_LIST_ENV = "PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST"
FP32_LIST_ENV = "PT_HPU_AUTOCAST_FP32_OPS_LIST"
#: The names older bridges read.
LEGACY_ENV = {BF16_LIST_ENV: "LOWER_LIST", FP32_LIST_ENV: "FP32_LIST"}
#: The file each list is written to, in the list directory.
FILE_NAMES = {BF16_LIST_ENV: "autocast_bf16_ops.txt", FP32_LIST_ENV: "autocast_fp32_ops.txt"}

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


def check_op_names(argument: str, ops: Iterable[str] | None) -> tuple[str, ...] | None:
    """``ops`` as a tuple after checking every name (``ValueError`` with close matches), or ``None`` for no list."""
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


def write_list(directory: Path, env: str, ops: tuple[str, ...]) -> Path:
    """Writes ``ops`` one a line to the file for ``env`` in ``directory``; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / FILE_NAMES[env]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(ops) + "\n")
    tmp.replace(path)
    return path


def read_list(path: str | None) -> tuple[str, ...] | None:
    """The op names in a list file, or ``None`` when ``path`` is unset or no file."""
    if not path or not Path(path).is_file():
        return None
    return tuple(line.strip() for line in Path(path).read_text().splitlines() if line.strip())
