"""Planted GIL workloads: a KV-transfer thread beside a compute thread, contended and released.
The *_bare variants are the same threads with no spans (uninstrumented code).

contended: the transfer thread packs each KV block with a pure-Python loop (it holds the GIL the whole
time), so the compute thread, whose matmuls release the GIL, waits for it after every matmul.
released: the same packing as one torch op per batch (the op releases the GIL); compute runs freely.
Both use one torch thread per op, so the two worker threads fit on two cores (see probes/gil.py).
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Any, Callable

import torch

from infragent.trace import span

TRANSFER_S = 1.5  # how long the transfer thread keeps sending batches
BLOCKS_PER_BATCH = 8
BLOCK_ITEMS = 256  # numbers per KV block
MATMUL_N = 256  # compute step: one (N x N) @ (N x N) matmul, about 0.3 ms on one core


def _pack_block_python(block: list[float]) -> float:
    """Per-block Python work: checksum a block item by item (holds the GIL throughout)."""
    acc = 0.0
    for i, x in enumerate(block):
        acc += x * (i & 7)
    return acc


def _spans(on: bool) -> Callable[..., Any]:
    return span if on else (lambda name, **args: contextlib.nullcontext())


def _transfer_python(stop: threading.Event, spans: bool = True, seconds: float = TRANSFER_S) -> None:
    blocks = [[float(j % 13) for j in range(BLOCK_ITEMS)] for _ in range(BLOCKS_PER_BATCH)]
    deadline = time.perf_counter() + seconds
    batch, region = 0, _spans(spans)
    while time.perf_counter() < deadline:
        with region("transfer", batch=batch):
            for block in blocks:
                _pack_block_python(block)
        batch += 1
    stop.set()


def _transfer_torch(stop: threading.Event, spans: bool = True) -> None:
    blocks = torch.arange(BLOCKS_PER_BATCH * BLOCK_ITEMS * 256, dtype=torch.float32).remainder_(13)
    deadline = time.perf_counter() + TRANSFER_S
    batch, region = 0, _spans(spans)
    while time.perf_counter() < deadline:
        with region("transfer", batch=batch):
            torch.cumsum(blocks, 0)  # the whole batch in one op (about 0.5 ms), which releases the GIL
        batch += 1
    stop.set()


def _compute(stop: threading.Event, spans: bool = True) -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
    b = torch.randn(MATMUL_N, MATMUL_N, generator=gen) / MATMUL_N ** 0.5
    step, region = 0, _spans(spans)
    while not stop.is_set():
        with region("step", step=step):
            a = torch.tanh(a @ b)
        step += 1


def _run(transfer, spans: bool = True) -> None:
    torch.set_num_threads(1)  # one core per worker thread: off-CPU time is then waiting, not oversubscription
    stop = threading.Event()
    threads = [threading.Thread(target=transfer, args=(stop, spans), name="kv-transfer"),
               threading.Thread(target=_compute, args=(stop, spans), name="compute")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def contended() -> None:
    """Planted: per-block pure-Python transfer work starves the compute thread of the GIL."""
    _run(_transfer_python)


def released() -> None:
    """The fix: the transfer's per-block loop is one torch op per batch, which releases the GIL."""
    _run(_transfer_torch)


def contended_bare() -> None:
    """contended, uninstrumented: no spans anywhere."""
    _run(_transfer_python, spans=False)


def contended_endless_bare() -> None:
    """contended_bare for ten minutes: longer than any budget a test gives the probe."""
    _run(lambda stop, spans: _transfer_python(stop, spans, seconds=600.0), spans=False)


def released_bare() -> None:
    """released, uninstrumented: no spans anywhere."""
    _run(_transfer_torch, spans=False)


def sleepy_bare() -> None:
    """A thread that mostly sleeps, uninstrumented: blocked, not waiting for the GIL."""
    def waiter() -> None:
        for _ in range(300):
            time.sleep(0.003)
    t = threading.Thread(target=waiter, name="poller")
    t.start()
    t.join()


def broken() -> None:
    """A workload that raises, for the probe's error path."""
    raise ValueError("planted failure in the workload")


def sleepy() -> None:
    """Blocked, but not on the GIL: a thread whose spans mostly sleep while nothing holds the GIL."""
    def waiter() -> None:
        for i in range(100):
            with span("poll", i=i):
                time.sleep(0.003)
    t = threading.Thread(target=waiter, name="poller")
    t.start()
    t.join()


def hung() -> None:
    """Deadlocks holding the GIL (a native mutex locked twice, called with the GIL held): no CPU work, and deaf
    to the interrupt (a mutex wait resumes after a signal; the Python handler never gets to run)."""
    import ctypes
    libc = ctypes.PyDLL(None)
    mutex = ctypes.create_string_buffer(64)  # zeroed: a default pthread mutex
    libc.pthread_mutex_lock(mutex)
    libc.pthread_mutex_lock(mutex)


def hung_once() -> None:
    """Hangs like hung() the first time (it leaves the file $HUNG_ONCE_MARKER), then runs contended()."""
    import os
    from pathlib import Path
    marker = Path(os.environ["HUNG_ONCE_MARKER"])
    if not marker.exists():
        marker.write_text("hung once")
        hung()
    contended()


def idle() -> None:
    """Waits on an event nobody sets: no CPU work, but the interrupt stops it."""
    threading.Event().wait()
