"""The process group both kinds of parallelism share: spawn the other ranks, join gloo, notice a dead rank,
stop them all. Rank 0 is always the engine's own process."""
from __future__ import annotations

import os
import socket
import time
from datetime import timedelta
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = timedelta(seconds=120)  # a collective waiting this long means a rank died: fail, do not hang


class RankDiedError(RuntimeError):
    """A rank's process is gone; the message names it and its exit code."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_group(rank: int, world: int, port: int) -> None:
    """Join the gloo group on this machine (rank 0 listens on port)."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=TIMEOUT)


def spawn_ranks(target: Callable[..., None], name: str, world: int, *args: Any) -> tuple[list, int]:
    """Start ranks 1..world-1 as target(*args, rank, world, port); returns them and the port rank 0 joins."""
    port = free_port()
    ctx = mp.get_context("spawn")
    workers = [ctx.Process(target=target, args=(*args, rank, world, port), daemon=True, name=f"{name}-{rank}")
               for rank in range(1, world)]
    for worker in workers:
        worker.start()
    return workers, port


def check_ranks(workers: list, grace_s: float = 0.0) -> None:
    """Raise RankDiedError at once if a rank is gone (every collective would otherwise wait TIMEOUT); with
    grace_s, look again until then (a collective that failed because a peer died may fail before that
    peer's exit is visible)."""
    deadline = time.monotonic() + grace_s
    dead = [w for w in workers if not w.is_alive()]
    while not dead and time.monotonic() < deadline:
        time.sleep(0.02)
        dead = [w for w in workers if not w.is_alive()]
    if dead:
        raise RankDiedError(", ".join(f"{w.name} (pid {w.pid}) exited with code {w.exitcode}" for w in dead)
                            + ": this parallel engine cannot run a step any more; restart it")


def stop_ranks(workers: list) -> None:
    """Tell the ranks to stop (when all are alive), wait for them, leave the group."""
    if not dist.is_initialized():
        return
    if all(w.is_alive() for w in workers):  # with a rank gone the broadcast would wait TIMEOUT
        try:
            dist.broadcast_object_list([None], src=0)
        except RuntimeError:
            pass  # a rank died just now: nothing left to tell
    for worker in workers:
        worker.join(timeout=30)
        if worker.is_alive():
            worker.terminate()
    dist.destroy_process_group()


def serve_steps(step: Callable[[tuple], None]) -> None:
    """A worker rank's loop: run step(message) for every message rank 0 broadcasts, until None; then leave
    the group and exit the process."""
    with torch.inference_mode():
        while True:
            message = [None]
            dist.broadcast_object_list(message, src=0)
            if message[0] is None:
                break
            step(message[0])
    dist.destroy_process_group()
    os._exit(0)
