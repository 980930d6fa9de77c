"""The worker processes' lifecycle as the router sees it: spawn them, wait until each is ready, read their
pipes into the router's inbox, open the KV store they share, and stop them."""
from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import queue
import threading
import time
from dataclasses import dataclass

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.disagg.messages import Broken, Stop, ToWorker, WorkerInfo
from infragent.engine.disagg.store import SharedStore, StoreLayout
from infragent.engine.disagg.tcp_store import StoreServer
from infragent.engine.disagg.worker import run_worker

log = logging.getLogger("infragent.disagg")


@dataclass
class WorkerHandle:
    """A worker process, its end of the pipe and whether the router still counts it alive."""

    role: str
    index: int  # position in the router's list; the store index records it as an entry's holder
    process: multiprocessing.process.BaseProcess
    conn: object
    alive: bool = True
    cause: str | None = None  # why the worker left, when it said so (Broken after Ready)

    @property
    def name(self) -> str:
        return f"{self.role} worker {self.index} (pid {self.process.pid})"

    def send(self, message: ToWorker) -> bool:
        """To the worker's pipe; False when the pipe is broken (the worker died)."""
        try:
            self.conn.send(message)
        except (OSError, ValueError):
            return False
        return True


def spawn_workers(config: EngineConfig, prefill_workers: int, decode_workers: int,
                  transfer_timeout_s: float) -> list[WorkerHandle]:
    """Start the prefill workers, then the decode workers (prefix caching off: every prompt's KV must go out)."""
    base = dataclasses.replace(config, enable_prefix_caching=False)
    configs = {"prefill": dataclasses.replace(base, kv_transfer=True), "decode": base}
    roles = ["prefill"] * prefill_workers + ["decode"] * decode_workers
    context = multiprocessing.get_context("spawn")
    workers = []
    for index, role in enumerate(roles):
        ours, theirs = context.Pipe()
        process = context.Process(target=run_worker, args=(role, configs[role], theirs, transfer_timeout_s),
                                  name=f"infragent-{role}-{index}", daemon=True)
        process.start()
        theirs.close()
        workers.append(WorkerHandle(role, index, process, ours))
    return workers


def wait_ready(worker: WorkerHandle, timeout_s: float) -> WorkerInfo:
    """The worker's Ready info; ConfigError when it could not build its engine, an error when it exits or
    does not answer within timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.conn.poll(0.5):
            message = worker.conn.recv()
            if isinstance(message, Broken):
                raise ConfigError(f"disagg: {worker.name} could not start: {message.message}")
            return message.info
        if not worker.process.is_alive():
            raise RuntimeError(f"disagg: {worker.name} exited (code {worker.process.exitcode}) while starting")
    raise TimeoutError(f"disagg: {worker.name} was not ready within {timeout_s:g} s")


def read_messages(worker: WorkerHandle, inbox: queue.SimpleQueue, stop: threading.Event) -> None:
    """A reader thread's loop: pipe messages → ("message", worker, message) in the inbox; a closed pipe or
    a dead process → ("died", worker)."""
    while not stop.is_set():
        try:
            if worker.conn.poll(0.2):
                inbox.put(("message", worker, worker.conn.recv()))
            elif not worker.process.is_alive():
                break
        except (EOFError, OSError):
            break
    if not stop.is_set():
        inbox.put(("died", worker))


def open_store(layout: StoreLayout, kind: str) -> SharedStore | StoreServer:
    """The shared-memory store (kind "shm"), or the TCP one when asked for or when shared memory is unavailable."""
    if kind == "shm":
        free = shm_free_bytes()
        if free is not None and free < layout.nbytes:  # a segment past tmpfs's space dies with SIGBUS on use
            log.warning("/dev/shm has %d MB free, the KV store needs %d MB; it falls back to TCP (lower "
                        "kv_cache_gb, or give the container a larger /dev/shm)", free >> 20, layout.nbytes >> 20)
        else:
            try:
                return SharedStore(layout)
            except OSError as err:
                log.warning("shared memory unavailable (%s); the KV store falls back to TCP", err)
    return StoreServer(layout)


def stop_workers(workers: list[WorkerHandle], timeout: float = 10.0) -> None:
    """Ask every worker to stop; kill those still running after timeout."""
    for w in workers:
        w.send(Stop())
    for w in workers:
        w.process.join(timeout)
        if w.process.is_alive():
            w.process.kill()
            w.process.join(5)


def shm_free_bytes() -> int | None:
    """Free bytes of /dev/shm (None where there is no such mount)."""
    try:
        stat = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize
