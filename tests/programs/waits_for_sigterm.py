"""Installs a SIGTERM handler that exits 42, says it is ready, and waits (``python -m lightning_gaudi`` test)."""

import signal
import sys
import time


def _stop(signum: int, frame: object) -> None:
    print("handled SIGTERM", flush=True)
    sys.exit(42)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stop)
    print("ready", flush=True)
    time.sleep(60)
