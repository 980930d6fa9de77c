"""A zygote for step workers: one process that imports torch once (most of a child's start-up) and forks a
step worker per request. The forked child drops every infragent module, puts its own code copy first on
sys.path, and runs probes/step_worker.py from there: the same child a fresh interpreter with that
PYTHONPATH would be, a second sooner.

    python -m infragent.probes.step_zygote FD   (FD: a Unix socket to the parent)

Per request on the socket: a JSON message {"source": FOLDER or null, "cwd": FOLDER or null, "env": {...}}
with three file descriptors attached (the child's stdin, stdout and stderr); answer {"pid": N}. The child
takes the parent's environment as it is now (what torch read at import stays the zygote's). The zygote keeps none of
those descriptors, so the parent sees end-of-file the moment the child dies. It never runs torch itself
(forking after a parallel region would hang OpenMP), and the kernel reaps its children.
"""
from __future__ import annotations

import json
import os
import runpy
import signal
import socket
import sys


def main() -> None:
    """Fork a worker per request until the parent closes its end of the socket."""
    import numpy  # noqa: F401  (what every engine child imports, loaded once here)
    import torch  # noqa: F401

    channel = socket.socket(fileno=int(sys.argv[1]))
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped by the kernel
    while True:
        message, fds, _, _ = socket.recv_fds(channel, 1 << 16, 3)
        if not message:
            return
        pid = os.fork()
        if pid == 0:
            channel.close()
            _become_worker(json.loads(message), fds)
        for fd in fds:
            os.close(fd)
        channel.sendall((json.dumps({"pid": pid}) + "\n").encode())


def _become_worker(request: dict, fds: list[int]) -> None:
    """In the forked child: its own streams, folder and code copy, then the step worker; never returns."""
    status = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the zygote's buffers stay behind)
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        if "env" in request:
            os.environ.clear()
            os.environ.update(request["env"])
        if request.get("cwd"):
            os.chdir(request["cwd"])
        if request.get("source"):
            sys.path.insert(0, request["source"])
            os.environ["PYTHONPATH"] = os.pathsep.join([request["source"]] + ([os.environ["PYTHONPATH"]]
                                                                             if os.environ.get("PYTHONPATH") else []))
        for name in [m for m in sys.modules if m == "infragent" or m.startswith("infragent.")]:
            del sys.modules[name]
        runpy.run_module("infragent.probes.step_worker", run_name="__main__", alter_sys=True)
        status = 0
    except BaseException:  # noqa: BLE001 (whatever it was goes to the child's stderr, which the parent reads)
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


if __name__ == "__main__":
    main()
