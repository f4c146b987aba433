"""Collective error classification on the errors torch 2.13 + gloo really raise, and the guard around collectives.

The texts below were recorded with 2 gloo processes on 127.0.0.1 (see :mod:`lightning_gaudi.distributed.errors`);
``test_collective_faults.py`` provokes the main ones for real.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from lightning_gaudi import HPUParallelStrategy, hpu
from lightning_gaudi.distributed import (
    CollectiveError,
    CollectiveTimeoutError,
    PeerLostError,
    classify,
    collective_errors,
    translate_error,
)

_GLOO = "/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp"

#: a peer exited before or during barrier, all_reduce, all_gather, broadcast_object_list, or DDP's gradient all-reduce
PEER_EXITED = RuntimeError(
    f"[{_GLOO}/pair.cc:553] Connection closed by peer [127.0.0.1]:6291. This is typically caused by a remote worker"
    " crashing. Check the logs of the remote worker before reporting an error. GLHF! 🏖️"
)
#: the peer aborted (gloo's size check killed it after a shape/size/dtype mismatch)
PEER_ABORTED = RuntimeError(
    f"[{_GLOO}/pair.cc:537] Read error [127.0.0.1]:57500: Connection reset by peer. This is typically caused by a"
    " remote worker hanging or bugs in the application. Check the logs of the remote worker before reporting an"
    " error. GLHF! 🏖️"
)
#: a peer slept past the process group's timeout of 3 s (recv: barrier, all_reduce; send: all_gather, broadcast)
RECV_TIMED_OUT = RuntimeError(f"[{_GLOO}/unbound_buffer.cc:78] Timed out waiting 3000ms for recv operation to complete")
SEND_TIMED_OUT = RuntimeError(
    f"[{_GLOO}/unbound_buffer.cc:129] Timed out waiting 3000ms for send operation to complete"
)
#: every collective of the group after a timeout
AFTER_TIMEOUT = RuntimeError("Application timeout caused pair closure")
#: c10d store: nobody listens / a key never arrives / the store's host died
STORE_CONNECT = dist.DistNetworkError(
    "The client socket has timed out after 1000ms while trying to connect to (127.0.0.1, 55105)."
)
STORE_WAIT = dist.DistStoreError("wait timeout after 1000ms, keys: /missing")
STORE_HOST_DIED = dist.DistNetworkError(
    "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
)

#: user errors: every rank raises them, nothing is wrong with the peers
USER_ERRORS = [
    RuntimeError("ProcessGroupGloo::broadcast: invalid root rank: 5"),
    RuntimeError("result type Float can't be cast to the desired output type Bool"),  # AVG of a bool tensor
    RuntimeError(  # TORCH_DISTRIBUTED_DEBUG=DETAIL, all_gather of shapes [2] and [3]
        "Detected mismatch between collectives on ranks. Rank 0 is running collective:"
        " CollectiveFingerPrint(SequenceNumber=0, OpType=ALLGATHER, TensorShape=[2], TensorDtypes=Float,"
        " TensorDeviceTypes=TensorOptions(dtype=float (default), device=cpu, layout=Strided (default),"
        " requires_grad=false (default), pinned_memory=false (default), memory_format=(nullopt))), but Rank 1 is"
        " running collective: CollectiveFingerPrint(SequenceNumber=0, OpType=ALLGATHER, TensorShape=[3], ...)"
    ),
    RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x3 and 4x8)"),  # backward's own
    RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn"),
    RuntimeError("Function 'MulBackward0' returned nan values in its 0th output."),  # detect_anomaly
    ValueError("the gathered tensor should be a list"),
]


@pytest.mark.parametrize(
    ("err", "kind"),
    [
        (PEER_EXITED, PeerLostError),
        (PEER_ABORTED, PeerLostError),
        (STORE_HOST_DIED, PeerLostError),
        (RuntimeError("[c10d] connect() failed: Connection refused"), PeerLostError),
        (RuntimeError("unexpected EOF while reading from peer"), PeerLostError),
        (RECV_TIMED_OUT, CollectiveTimeoutError),
        (SEND_TIMED_OUT, CollectiveTimeoutError),
        (AFTER_TIMEOUT, CollectiveTimeoutError),
        (STORE_CONNECT, CollectiveTimeoutError),
        (STORE_WAIT, CollectiveTimeoutError),
        (
            RuntimeError("Watchdog caught collective operation timeout: ran for 600000 milliseconds before timing out"),
            CollectiveTimeoutError,
        ),
    ],
)
def test_transport_failures_are_classified(err: RuntimeError, kind: type[CollectiveError]) -> None:
    assert classify(err) is kind


@pytest.mark.parametrize("err", USER_ERRORS)
def test_user_errors_are_not_classified(err: Exception) -> None:
    assert classify(err) is None
    assert translate_error(err, "all_gather", timedelta(seconds=5)) is err


def test_words_that_merely_contain_eof_are_not_a_lost_peer() -> None:
    assert classify(RuntimeError("the thereof-clause of the spec")) is None


def test_a_collective_error_stays_what_it_is() -> None:
    err = PeerLostError("already translated")
    assert classify(err) is PeerLostError
    assert translate_error(err, "barrier", timedelta(seconds=1)) is err


def test_messages_say_who_what_how_long_and_how_to_resume() -> None:
    lost = translate_error(PEER_EXITED, "all_reduce", timedelta(seconds=20))
    assert isinstance(lost, PeerLostError)
    assert str(lost).startswith("Rank ?/?: all_reduce failed: a peer process died (its connection closed")
    assert "Received data size doesn't match expected size" in str(lost)  # the hint for a peer gloo aborted
    assert "timeout=0:00:20" in str(lost)
    assert "resolve_ckpt_path('auto', <checkpoint dir>)" in str(lost)
    assert str(lost).endswith(f"Cause: RuntimeError: {PEER_EXITED}")
    hung = translate_error(RECV_TIMED_OUT, "barrier 'save'", timedelta(seconds=5))
    assert isinstance(hung, CollectiveTimeoutError)
    assert str(hung).startswith("Rank ?/?: barrier 'save' failed: a peer process did not answer within timeout=0:00:05")
    assert "torchrun --max-restarts N, SLURM --requeue" in str(hung)
    assert "HPUParallelStrategy(timeout=...)" in str(hung)


def test_the_guard_translates_transport_failures_and_passes_the_rest() -> None:
    guard = collective_errors("barrier", timedelta(seconds=20))
    with pytest.raises(CollectiveTimeoutError, match=r"barrier failed: .* within timeout=0:00:20 ") as info, guard:
        raise AFTER_TIMEOUT
    assert info.value.__cause__ is AFTER_TIMEOUT
    with pytest.raises(PeerLostError) as lost, guard:  # the same guard, again: it holds no state
        raise PEER_EXITED
    assert lost.value.__cause__ is PEER_EXITED
    for err in USER_ERRORS:
        with pytest.raises(type(err)) as passed, guard:
            raise err
        assert passed.value is err
    with pytest.raises(KeyboardInterrupt), guard:
        raise KeyboardInterrupt


def test_the_guard_is_cheap() -> None:
    """It wraps every backward: a plain class with __slots__, no generator, no allocation per use."""
    guard = collective_errors("backward (gradient all-reduce)", timedelta(seconds=5))
    assert not hasattr(guard, "__dict__")
    start = time.perf_counter()
    for _ in range(100_000):
        with guard:
            pass
    assert (time.perf_counter() - start) / 100_000 < 5e-6  # about 0.1 µs; generous for a busy CI machine


@pytest.mark.parametrize(("raised", "kind"), [(PEER_EXITED, PeerLostError), (RECV_TIMED_OUT, CollectiveTimeoutError)])
def test_backward_reports_a_lost_or_hung_peer(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, raised: RuntimeError, kind: type[CollectiveError]
) -> None:
    def backward(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(DDPStrategy, "backward", backward)
    strategy = HPUParallelStrategy(timeout=5)
    with pytest.raises(kind, match=r"backward \(gradient all-reduce\) failed: .*timeout=0:00:05") as info:
        strategy.backward(torch.zeros(()), None)
    assert info.value.__cause__ is raised


@pytest.mark.parametrize("raised", USER_ERRORS[3:6])
def test_backward_passes_its_own_errors_unchanged(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, raised: RuntimeError
) -> None:
    def backward(*args: object, **kwargs: object) -> None:
        raise raised

    monkeypatch.setattr(DDPStrategy, "backward", backward)
    with pytest.raises(RuntimeError) as info:
        HPUParallelStrategy(timeout=5).backward(torch.zeros(()), None)
    assert info.value is raised


@pytest.mark.parametrize(
    ("method", "args", "what"),
    [("barrier", ("ckpt",), "barrier 'ckpt'"), ("broadcast", ({"a": 1},), "broadcast")],
)
def test_strategy_collectives_are_guarded(
    eager_hpu: hpu.Backend, monkeypatch: pytest.MonkeyPatch, method: str, args: tuple[object, ...], what: str
) -> None:
    def fail(*_: object, **__: object) -> None:
        raise PEER_EXITED

    monkeypatch.setattr(DDPStrategy, method, fail)
    with pytest.raises(PeerLostError, match=rf"^Rank \?/\?: {what} failed: a peer process died"):
        getattr(HPUParallelStrategy(timeout=5), method)(*args)
