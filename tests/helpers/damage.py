"""Checkpoints that verify but do not load, for the resume tests."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import torch


def make_unloadable(path: Path) -> None:
    """Rewrites the ``torch.save`` file ``path`` so that it verifies (whole, CRC-32s right, its pickle parses) but does
    not load: it holds an object of a class whose module is gone (a checkpoint of another version of the code)."""
    module = types.ModuleType("lightning_gaudi_vanished")
    exec("class Gone:\n    pass", module.__dict__)
    module.Gone.__module__ = module.__name__
    sys.modules[module.__name__] = module
    try:
        checkpoint = torch.load(path, weights_only=False)
        checkpoint["gone"] = module.Gone()
        torch.save(checkpoint, path)
    finally:
        del sys.modules[module.__name__]
