"""The MoE exchange's native transport: an all-to-all through a shared-memory segment (kernels/moe_exchange.c),
called with ctypes, keeping the GIL or releasing it.

`moe_exchange = "native-gil-held"` loads the library with ctypes.PyDLL: while a rank copies its rows and waits
for its peers, no other Python thread of that process runs, as an expert-parallel communication library whose
C++ entry points forget to release the GIL (case study 2; DeepEP PR #142 is the public twin).
`moe_exchange = "native"` makes the same calls through ctypes.CDLL, which releases it.
"""
from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import subprocess
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from infragent.engine.kernels.build import build_lock
from infragent.engine.parallel.group import RankDiedError

SOURCE = Path(__file__).parents[1] / "kernels" / "moe_exchange.c"
TIMEOUT_S = 120.0  # a rank that is alive but never arrives: the same limit as the gloo collectives
EXITED = 4  # the code for a peer whose process is gone
ERRORS = {1: "did not arrive within {timeout:.0f} s", 2: "sent a different number of rows than it announced",
          3: "has more rows for one rank than the segment holds ({capacity} bytes)", 4: "exited"}


class NativeExchangeError(RuntimeError):
    """The native exchange could not be built, or a rank failed it; the message names the rank."""


def library_path() -> Path:
    """The compiled transport (built once per machine with the system C compiler, cached by source)."""
    text = SOURCE.read_bytes()
    root = Path(os.environ.get("INFRAGENT_KERNEL_CACHE", Path.home() / ".cache" / "infragent" / "kernels"))
    folder = root / ("moe-exchange-" + hashlib.sha256(text).hexdigest()[:16])
    built = folder / "moe_exchange.so"
    if built.exists():
        return built
    folder.mkdir(parents=True, exist_ok=True)
    with build_lock(folder):
        if not built.exists():
            partial = folder / f"moe_exchange.{os.getpid()}.so"
            compiler = os.environ.get("CC", "cc")
            try:
                subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-o", str(partial), str(SOURCE)], check=True,
                               capture_output=True, text=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                detail = getattr(exc, "stderr", "") or str(exc)
                raise NativeExchangeError(f"moe_exchange: {SOURCE.name} did not build with {compiler}: "
                                          f"{detail.strip().splitlines()[-1] if detail.strip() else exc}; "
                                          "install a C compiler or use moe_exchange gloo") from exc
            partial.rename(built)
    return built


class NativeAllToAll:
    """This rank's end of the shared-memory all-to-all (every rank builds one, in lock step)."""

    def __init__(self, rank: int, world: int, capacity: int, release_gil: bool) -> None:
        """capacity: the most bytes one rank sends another in one call. Collective: joins the group's segment
        (rank 0 makes it and tells the others its name over the process group)."""
        library = str(library_path())
        self._calls = {}  # release_gil -> the entry point, loaded through CDLL (True) or PyDLL (False)
        for release, loader in ((True, ctypes.CDLL), (False, ctypes.PyDLL)):
            call = loader(library).ie_exchange
            call.restype = ctypes.c_int
            call.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_uint64,
                             ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_double, ctypes.POINTER(ctypes.c_int)]
            self._calls[release] = call
        self.rank, self.world, self.capacity = rank, world, capacity
        self.release_gil = release_gil  # per process: the peers need not agree
        self.seq = 0
        size = ctypes.CDLL(library).ie_segment_bytes
        size.restype, size.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_int64]
        self.segment = self._join(int(size(world, capacity)))
        self.base = ctypes.addressof(ctypes.c_char.from_buffer(self.segment))
        pids = [None] * world
        dist.all_gather_object(pids, os.getpid())
        self.pids = (ctypes.c_int * world)(*pids)

    def _join(self, size: int) -> mmap.mmap:
        """Map the group's segment: rank 0 creates it, every rank maps it, then rank 0 unlinks the name (the
        memory lives until the last rank unmaps it, so nothing is left behind when a rank dies)."""
        name = [f"/dev/shm/infragent-moe-{uuid.uuid4().hex}" if self.rank == 0 else None]
        if self.rank == 0:
            with open(name[0], "wb") as f:
                f.truncate(size)
        dist.broadcast_object_list(name, src=0)
        with open(name[0], "r+b") as f:
            segment = mmap.mmap(f.fileno(), size)
        dist.barrier()
        if self.rank == 0:
            os.unlink(name[0])
        return segment

    def __call__(self, send: torch.Tensor, send_rows: list[int], recv_rows: list[int]) -> torch.Tensor:
        """Rows of send [sum(send_rows), cols], send_rows[d] of them to rank d in order; returns the rows
        received [sum(recv_rows), cols], recv_rows[s] from rank s in order."""
        send = send.contiguous()
        row_bytes = send.shape[1] * send.element_size()
        recv = torch.empty(sum(recv_rows), send.shape[1], dtype=send.dtype)
        send_bytes = (ctypes.c_int64 * self.world)(*(n * row_bytes for n in send_rows))
        recv_bytes = (ctypes.c_int64 * self.world)(*(n * row_bytes for n in recv_rows))
        self.seq += 1
        peer = ctypes.c_int(-1)
        code = self._calls[self.release_gil](self.base, self.capacity, self.rank, self.world, self.seq, send.data_ptr(),
                              send_bytes, recv.data_ptr(), recv_bytes, self.pids, TIMEOUT_S, ctypes.byref(peer))
        if code:
            what = ERRORS.get(code, f"failed with code {code}").format(timeout=TIMEOUT_S, capacity=self.capacity)
            error = RankDiedError if code == EXITED else NativeExchangeError
            raise error(f"moe exchange: rank {peer.value} (pid {self.pids[peer.value]}) {what}; "
                        "this expert-parallel engine cannot run a step any more; restart it")
        return recv
