"""``lightning_gaudi.distributed.shutdown`` loaded from its file alone, for a test process that needs nothing else of
the package: the module imports torch and the standard library only, while importing it through its package imports
Lightning first, seconds of CPU per process."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def load() -> ModuleType:
    """The module, run from ``lightning_gaudi/distributed/shutdown.py`` of the package this Python would import."""
    package = importlib.util.find_spec("lightning_gaudi")  # finds the package without importing it
    assert package is not None
    assert package.origin is not None
    path = Path(package.origin).parent / "distributed" / "shutdown.py"
    spec = importlib.util.spec_from_file_location("lightning_gaudi_shutdown", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
