"""Saves one large checkpoint, so a test can SIGKILL the process half-way through the write.

``python big_save.py PATH atomic|plain MEGABYTES``: ``atomic`` uses ``HPUCheckpointIO`` (what the HPU strategies
save with), ``plain`` uses ``torch.save`` straight to ``PATH`` (the non-atomic baseline).
"""

from __future__ import annotations

import sys

import torch


def main() -> None:
    path, mode, megabytes = sys.argv[1], sys.argv[2], int(sys.argv[3])
    checkpoint = {"global_step": 2, "state_dict": {"w": torch.full((megabytes * 2**18,), 2.0)}}
    if mode == "atomic":
        from lightning_gaudi.checkpoint_io import HPUCheckpointIO  # only here: importing Lightning takes seconds

        HPUCheckpointIO().save_checkpoint(checkpoint, path)
    else:
        torch.save(checkpoint, path)


if __name__ == "__main__":
    main()
