"""The example app's console and run log.

- Notices nobody asked for stay off the console: torch's ``LeafSpec`` deprecation warning, which Lightning's own
  pytree helper triggers at the first evaluation batch (glued onto the sanity-check bar), and Lightning's tips
  advertising its cloud services (``litlogger``, ``litmodels``).
- Lightning's and lightning_gaudi's log lines go to the run folder's log (Hydra's ``<job>.log``) as well as to the
  console. Both libraries print through console handlers of their own and do not pass their lines on to the root
  logger, where Hydra's file handler listens, so without this the run's log stays empty. Rank processes that the app
  starts itself (``lightning_gaudi.app.hydra.run``, one per card) run no Hydra logging: they find the file through
  :data:`LOG_FILE_ENV` and write to it (rank zero) or beside it (``<job>_rank<label>.log``, the label of
  ``${lg.rank_suffix:}``).

:func:`setup` does both; the app's entry point and the task (in every rank process) call it.
"""

from __future__ import annotations

import logging
import os
import warnings
from pathlib import Path

from lightning_gaudi.app.hydra.resolvers import rank_suffix

#: The run's log file, exported by the app's process for the rank processes it starts.
LOG_FILE_ENV = "GPT_RECIPE_LOG_FILE"
#: The loggers whose lines belong in the run's log, and that do not pass them on to the root logger.
LIBRARY_LOGGERS = ("lightning.pytorch", "lightning.fabric", "lightning_gaudi")
#: Where Lightning logs its tips (and its other rank-zero notices).
LIGHTNING_NOTICES = "lightning.pytorch.utilities.rank_zero"
#: Hydra's default log-line format, for the files the rank processes open.
LOG_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def _not_a_tip(record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("💡 Tip:")


def quiet_upstream_noise() -> None:
    """Leaves torch's ``LeafSpec`` deprecation warning and Lightning's tips off the console (idempotent)."""
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)", category=FutureWarning)
    notices = logging.getLogger(LIGHTNING_NOTICES)
    if _not_a_tip not in notices.filters:
        notices.addFilter(_not_a_tip)


def _run_log_handlers() -> list[logging.FileHandler]:
    """The run log's file handlers: Hydra's on the root logger, or one on :data:`LOG_FILE_ENV` in a rank process."""
    hydra_files = [
        h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler) and h.baseFilename != os.devnull
    ]
    if hydra_files:
        os.environ[LOG_FILE_ENV] = hydra_files[0].baseFilename
        return hydra_files
    run_log = os.environ.get(LOG_FILE_ENV)
    if not run_log:
        return []
    path = Path(run_log)
    path = path.with_name(f"{path.stem}{rank_suffix()}{path.suffix}")
    for handler in logging.getLogger(LIBRARY_LOGGERS[0]).handlers:
        if isinstance(handler, logging.FileHandler) and handler.baseFilename == str(path.resolve()):
            return [handler]
    handler = logging.FileHandler(path, delay=True)  # a rank that logs nothing leaves no empty file
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    return [handler]


def log_to_run_folder() -> None:
    """Sends Lightning's and lightning_gaudi's log lines to the run's log file too (idempotent)."""
    handlers = _run_log_handlers()
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.propagate:
            continue  # its lines already reach the root logger's handlers
        for handler in handlers:
            if handler not in logger.handlers:
                logger.addHandler(handler)


def setup() -> None:
    """:func:`quiet_upstream_noise` and :func:`log_to_run_folder`."""
    quiet_upstream_noise()
    log_to_run_folder()
