"""One rank of a 2-process gloo group on 127.0.0.1 that provokes a collective fault and records what it saw.

``python collective_faults.py SCENARIO RANK PORT OUT_DIR`` (``tests/distributed/test_collective_faults.py`` starts two).
Each event is appended to ``OUT_DIR/rank<RANK>.jsonl`` as ``{"step", "outcome", "type", "bases", "message"}`` right
away, so a rank that gloo aborts still leaves the events before the abort.

Scenarios:

- ``raw-hang-exit`` (plain torch, one pair of processes for both faults): rank 1 sleeps past the group's 2 s timeout
  while rank 0 runs ``all_reduce`` twice; then both ranks form a new group, rank 1 exits and rank 0 runs
  ``all_reduce`` (the ``raw-exit`` step);
- ``raw-mismatch``: ``all_gather`` of shapes (2,) and (3,) (plain torch, as Lightning's all_gather calls it);
- ``strategy``: through ``HPUParallelStrategy``: ``all_gather`` and ``reduce`` of mismatched shapes, then a good
  ``all_gather``, then rank 1 exits and rank 0 waits at a ``barrier``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist


def _record(out: Path, rank: int, step: str, error: BaseException | None = None, **extra: Any) -> None:
    event: dict[str, Any] = {"step": step, "outcome": "ok" if error is None else "error", **extra}
    if error is not None:
        event.update(type=type(error).__name__, bases=[c.__name__ for c in type(error).__mro__], message=str(error))
    with open(out / f"rank{rank}.jsonl", "a") as f:
        f.write(json.dumps(event) + "\n")


def _attempt(out: Path, rank: int, step: str, action: Any) -> Any:
    try:
        result = action()
    except Exception as err:
        _record(out, rank, step, err)
        return None
    _record(out, rank, step, result=result.tolist() if isinstance(result, torch.Tensor) else None)
    return result


def _raw(scenario: str, rank: int, out: Path, store: Any = None) -> None:
    dist.init_process_group("gloo", rank=rank, world_size=2, timeout=timedelta(seconds=2), store=store)
    dist.barrier()
    if scenario == "raw-exit":
        if rank == 1:
            os._exit(1)
        time.sleep(0.5)
        _attempt(out, rank, "all_reduce", lambda: dist.all_reduce(torch.ones(4)))
    elif scenario == "raw-hang-exit":
        if rank == 1:
            time.sleep(4)
        else:
            _attempt(out, rank, "all_reduce", lambda: dist.all_reduce(torch.ones(4)))
            _attempt(out, rank, "all_reduce again", lambda: dist.all_reduce(torch.ones(4)))
        dist.destroy_process_group()
        _raw("raw-exit", rank, out, dist.PrefixStore("exit", store.underlying_store))
    elif scenario == "raw-mismatch":
        tensor = torch.zeros(2 + rank)
        gathered = [torch.empty_like(tensor) for _ in range(2)]
        _attempt(out, rank, "all_gather", lambda: dist.all_gather(gathered, tensor) or torch.cat(gathered))


def _strategy(rank: int, out: Path) -> None:
    from lightning_gaudi import HPUParallelStrategy
    from lightning_gaudi.distributed import init_process_group

    init_process_group("gloo", rank, 2, timedelta(seconds=20))
    strategy = HPUParallelStrategy(timeout=20)
    _attempt(out, rank, "all_gather mismatch", lambda: strategy.all_gather(torch.zeros(2 + rank)))
    _attempt(out, rank, "reduce mismatch", lambda: strategy.reduce(torch.ones(2, 2 + rank), reduce_op="sum"))
    _attempt(out, rank, "all_gather", lambda: strategy.all_gather(torch.full((2,), float(rank))))
    strategy.barrier()
    if rank == 1:
        os._exit(1)
    time.sleep(0.5)
    _attempt(out, rank, "barrier", lambda: strategy.barrier("after exit"))


def main() -> None:
    scenario, rank, port, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    if scenario == "strategy":
        _strategy(rank, out)
    elif scenario == "raw-hang-exit":  # two groups in turn on one store, each under its own prefix
        store = dist.TCPStore("127.0.0.1", int(port), 2, rank == 0, timeout=timedelta(seconds=30))
        _raw(scenario, rank, out, dist.PrefixStore("hang", store))
    else:
        _raw(scenario, rank, out)
    os._exit(0)  # no process-group teardown: the peer may be gone


if __name__ == "__main__":
    main()
