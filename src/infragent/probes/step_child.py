"""How a step worker's child starts: forked from a zygote that has torch loaded already
(probes/step_zygote.py), or a fresh interpreter where the zygote cannot run (or INFRAGENT_STEP_ZYGOTE=0).
Either way the child runs probes/step_worker.py from its own code copy; the zygote saves the second a fresh
interpreter spends importing torch, for every candidate of a run."""
from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO

CHILD_ENV = {"PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",  # same hashing in every child
             "OMP_WAIT_POLICY": "PASSIVE"}  # an idle child's threads must not spin on the cores the other times


class ForkedChild:
    """A step worker forked by the zygote: its pid and this process's ends of its pipes (the Popen calls
    StepWorker uses). It is not our child, so it is watched and signalled through a pidfd where the kernel has
    them: a pid reused after it exits can never be mistaken for it."""

    def __init__(self, pid: int, stdin: IO[str], stdout: IO[str]) -> None:
        self.pid, self.stdin, self.stdout = pid, stdin, stdout
        self.returncode: int | None = None
        try:
            self.pidfd: int | None = os.pidfd_open(pid)
        except (AttributeError, OSError):  # no pidfds (old kernel), or it is gone already
            self.pidfd = None

    def poll(self) -> int | None:
        """None while it runs (the zygote's children are reaped by the kernel when they exit)."""
        if self.returncode is None:
            if self.pidfd is not None:
                exited = bool(select.select([self.pidfd], [], [], 0)[0])
            else:
                try:
                    os.kill(self.pid, 0)
                    exited = False
                except ProcessLookupError:
                    exited = True
            if exited:
                self.returncode = -1
        return self.returncode

    def kill(self) -> None:
        """SIGKILL it."""
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
                if self.pidfd is not None:
                    signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
                else:
                    os.kill(self.pid, signal.SIGKILL)

    def wait(self, timeout: float = 10.0) -> int | None:
        """Until it is gone (or timeout); then its pipes and pidfd are closed."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        for stream in (self.stdin, self.stdout):
            with contextlib.suppress(OSError):  # a pipe whose other end is gone
                stream.close()
        if self.pidfd is not None and self.returncode is not None:
            os.close(self.pidfd)
            self.pidfd = None
        return self.returncode


class Child:
    """A started step worker child and the file its stderr goes to."""

    def __init__(self, proc: subprocess.Popen | ForkedChild, stderr: Path) -> None:
        self.proc, self.stderr = proc, stderr

    def stderr_tail(self, lines: int = 3) -> str:
        """Its stderr's last lines, on one line."""
        try:
            return " | ".join(self.stderr.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        """Kill it, wait for it, remove its stderr file."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.stderr.unlink(missing_ok=True)


def start_child(code: Path | None) -> Child:
    """A step worker child running the infragent of `code` (its src/, or the folder itself; None: this
    process's own), forked from the zygote where it can be."""
    source = None
    if code is not None:
        source = str(code / "src" if (code / "src" / "infragent").is_dir() else code)
    handle, name = tempfile.mkstemp(prefix="step-worker-", suffix=".stderr")
    stderr = Path(name)
    try:
        if os.environ.get("INFRAGENT_STEP_ZYGOTE", "1") != "0":
            forked = _fork(source, code, handle)
            if forked is not None:
                return Child(forked, stderr)
        env = {**os.environ, **CHILD_ENV}
        if source is not None:
            env["PYTHONPATH"] = os.pathsep.join([source] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        proc = subprocess.Popen([sys.executable, "-m", "infragent.probes.step_worker"], cwd=code, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=handle, text=True)
        return Child(proc, stderr)
    finally:
        os.close(handle)


_zygote: tuple[subprocess.Popen, socket.socket] | None = None
_lock = threading.Lock()


def _fork(source: str | None, cwd: Path | None, stderr: int) -> ForkedChild | None:
    """Ask the zygote (started on first use, again if it died) for a child; None where it cannot give one."""
    global _zygote
    with _lock:
        try:
            if _zygote is not None and _zygote[0].poll() is not None:
                _drop()
            if _zygote is None:
                ours, theirs = socket.socketpair()
                proc = subprocess.Popen([sys.executable, "-m", "infragent.probes.step_zygote", str(theirs.fileno())],
                                        pass_fds=[theirs.fileno()], env={**os.environ, **CHILD_ENV},
                                        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
                theirs.close()
                _zygote = (proc, ours)
            channel = _zygote[1]
            child_in, our_in = os.pipe()
            our_out, child_out = os.pipe()
            try:
                request = json.dumps({"source": source, "cwd": str(cwd) if cwd else None,
                                      "env": {**os.environ, **CHILD_ENV}}).encode()
                socket.send_fds(channel, [request], [child_in, child_out, stderr])
                answer = b""
                while not answer.endswith(b"\n"):
                    more = channel.recv(1 << 12)
                    if not more:
                        raise ConnectionError("the step zygote exited")
                    answer += more
            except OSError:
                os.close(our_in)
                os.close(our_out)
                _drop()
                return None
            finally:
                os.close(child_in)
                os.close(child_out)
            pid = int(json.loads(answer)["pid"])
            return ForkedChild(pid, os.fdopen(our_in, "w", encoding="utf-8"), os.fdopen(our_out, encoding="utf-8"))
        except OSError:
            _drop()
            return None


def _drop() -> None:
    """Forget the zygote (stopped if it still runs): the next child starts a new one."""
    global _zygote
    if _zygote is not None:
        proc, channel = _zygote
        channel.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    _zygote = None
