"""The target runner: launch a target with knob values in its own process group, wait until it is ready,
capture its logs, and stop it by that process group only (never a broad kill)."""
from __future__ import annotations

import collections
import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import psutil

from infragent.lab.spec import Target
from infragent.probes.processes import group_of, listener_pid, port_of

def engine_config(target: Target, knobs: dict[str, Any]) -> Any:
    """The EngineConfig an engine target's server would run with these knobs (its serve_args applied)."""
    import json

    from infragent.engine.config import EngineConfig, HybridConfig
    from infragent.engine.knobs import from_argv

    fields: dict[str, Any] = {"model": target.model, **from_argv(target.serve_args), **knobs}
    args = list(target.serve_args)
    if "--hybrid-config" in args[:-1]:
        fields["hybrid"] = HybridConfig(**json.loads(args[args.index("--hybrid-config") + 1]))
    return EngineConfig(**fields)


class TargetError(RuntimeError):
    """The target did not start or become ready; the message carries the tail of its log."""


class TargetDied(TargetError):
    """A launched target exited, lost its port or stopped answering: nothing it served counts as a measurement."""


PORT_HINT = ("put --port {port} (or your server's port flag) in [target] command, and {port} in base_url and "
             "ready_url: every launch then gets its own free port")


_HANDED_OUT: collections.deque[int] = collections.deque(maxlen=64)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, and not one handed out lately (a launch
    spawned but not yet listening holds its port without binding it)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.append(port)
            return port


def has_port_placeholder(target: Target) -> bool:
    """Whether every launch of this target gets its own port (engine targets always do)."""
    return target.kind != "command" or "{port}" in (target.command or "")


def require_own_ports(target: Target, why: str) -> None:
    """Refuse a command target without {port} where two instances must run at once."""
    if not has_port_placeholder(target):
        raise TargetError(f"[target] command has no {{port}}, but {why}: two instances would share one port and "
                          f"the second would measure the first. Fix: {PORT_HINT}")


def launch_command(target: Target, knobs: dict[str, Any]) -> tuple[list[str], str, str]:
    """(argv, base_url, ready_url) for a target with these knob values, on a free port."""
    port = free_port()
    if target.kind == "command":
        fields = {**knobs, "port": port, "python": sys.executable}  # {python}: the interpreter running infragent
        try:
            command = target.command.format(**fields)  # type: ignore[union-attr]
            urls = [target.base_url.format(**fields), target.ready_url.format(**fields)]  # type: ignore[union-attr]
        except KeyError as err:
            raise TargetError(f"target.command: no value for knob {err}; give it a default in [knobs.{err.args[0]}] "
                              "or a value on the command line") from None
        except (IndexError, ValueError) as err:
            raise TargetError(f"target.command: {err}; write literal braces as {{{{ and }}}}") from None
        return shlex.split(command), urls[0].rstrip("/"), urls[1]
    from infragent.engine.knobs import KNOBS, KnobError, to_argv

    unknown = [k for k in knobs if k not in KNOBS]
    if unknown:
        raise TargetError(f"knobs {unknown}: not settable on the engine server; settable: {', '.join(KNOBS)}")
    try:
        flags = to_argv(knobs)
    except KnobError as err:
        raise TargetError(f"knobs: {err}") from None
    argv = [sys.executable, "-m", "infragent.cli", "serve", "--model", target.model, "--port", str(port),
            *target.serve_args, *flags]
    url = f"http://127.0.0.1:{port}"
    return argv, url, f"{url}/health"


def code_environment(target: Target, code: Path | None) -> tuple[Path | None, dict[str, str]]:
    """(working folder, extra environment) for a launch from a copy of the target's code: the engine's server
    imports infragent from code/src (code is a checkout of this project); a command runs inside code."""
    if code is None:
        return None, {}
    if target.kind != "engine":
        return code, {}
    source = code / "src" if (code / "src" / "infragent").is_dir() else code
    inherited = os.environ.get("PYTHONPATH")
    return code, {"PYTHONPATH": os.pathsep.join([str(source)] + ([inherited] if inherited else []))}


class TargetProcess:
    """A running target in its own process group; use as a context manager.

    Readiness is proven, not assumed: the readiness URL must answer 200 *and* the socket listening on its
    port must belong to this launch's process group, so a server left on a fixed port cannot answer for it.
    on_launch is called with the process right after it starts, before the readiness wait (the ledger
    records the group then, so an interrupted run can stop it)."""

    def __init__(self, target: Target, knobs: dict[str, Any], log_path: str | Path,
                 on_launch: Callable[["TargetProcess"], None] | None = None, code: Path | None = None,
                 on_ready: Callable[["TargetProcess"], None] | None = None) -> None:
        self.argv, self.base_url, self.ready_url = launch_command(target, knobs)
        self.cwd, self.env = code_environment(target, code)
        self.port = port_of(self.ready_url)
        self.timeout = target.ready_timeout_s
        self.hang_timeout = target.hang_timeout_s
        self.death: str | None = None  # what the watchdog saw: the target exited or stopped answering
        self._stopping = threading.Event()
        self.log_path = Path(log_path)
        self.on_launch, self.on_ready = on_launch, on_ready
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None
        self.listener_check = target.listener_check
        self.is_ready = False

    def start(self) -> "TargetProcess":
        """Launch (new session = new process group) and wait until it is proven ready; stop it on any failure."""
        return self.spawn().ready()

    def spawn(self) -> "TargetProcess":
        """Launch without waiting (start several, then wait on each: they load in parallel)."""
        squatter = None if self.listener_check else listener_pid(self.port)
        if squatter is not None:
            raise TargetError(f"port {self.port} is in use before the launch (pid {squatter}); with "
                              "listener_check = false a launch is trusted only on a port that was free")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            try:
                self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=self.cwd, env={**os.environ, "PYTHONUNBUFFERED": "1", **self.env})
            except (FileNotFoundError, PermissionError) as err:
                raise TargetError(f"cannot launch the target: {self.argv[0]!r}: {err.strerror}; install it or fix "
                                  "[target] command in the spec") from None
        self.started_at = time.time()
        try:
            if self.on_launch is not None:
                self.on_launch(self)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> "TargetProcess":
        """Wait until the spawned target is proven ready (once); stop it on any failure."""
        if self.is_ready:
            return self
        try:
            self._wait_ready()
        except BaseException:  # not ready, Ctrl-C or SIGTERM while waiting: never leave it running
            self.stop()
            raise
        self.is_ready = True
        if self.on_ready is not None:
            self.on_ready(self)
        threading.Thread(target=self._watch, name=f"watchdog-{self.port}", daemon=True).start()
        return self

    def _watch(self) -> None:
        """While ready: a target that exits, or answers nothing for hang_timeout_s, is noted and stopped, so a
        probe blocked on it returns (and check_alive then voids what it measured)."""
        last_answer = time.monotonic()
        while not self._stopping.wait(1.0):
            if self.proc.poll() is not None:  # type: ignore[union-attr]
                self.death = f"target died: exited with status {self.proc.returncode}"  # type: ignore[union-attr]
                return
            try:
                httpx.get(self.ready_url, timeout=min(5.0, self.hang_timeout))
                last_answer = time.monotonic()
            except httpx.HTTPError:
                if time.monotonic() - last_answer > self.hang_timeout:
                    self.death = (f"target hung: answered nothing at {self.ready_url} for {self.hang_timeout:.0f}s "
                                  "(hang_timeout_s); stopped it")
                    stop_group(self.proc.pid, 5.0, reap=self.proc.poll)  # type: ignore[union-attr]
                    return

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # type: ignore[union-attr]
                raise TargetError(f"target exited with status {self.proc.returncode} before it was ready "  # type: ignore[union-attr]
                                  f"(port {self.port}): {self.log_tail()}")
            try:
                answered = httpx.get(self.ready_url, timeout=2).status_code == 200
            except httpx.HTTPError:
                answered = False
            if answered:
                owner = listener_pid(self.port)
                if not self.listener_check or (owner is not None and group_of(owner) == self.pgid):
                    return
                raise TargetError(f"port {self.port} answered {self.ready_url}, but the listener is "
                                  f"{'pid ' + str(owner) if owner else 'not a process of ours'}, not this launch's "
                                  f"process group {self.pgid}: the target could not bind its port (another server "
                                  f"holds it). Target log: {self.log_tail()}")
            time.sleep(0.2)
        raise TargetError(f"target hung: not ready at {self.ready_url} after {self.timeout:.0f}s "
                          f"(ready_timeout_s): {self.log_tail()}")

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None  # session leader: its pid is the group id

    def check_alive(self) -> None:
        """Raise TargetDied unless the process still runs and still owns its port."""
        if self.proc is None:
            raise TargetDied("target was never started")
        if self.death and "hung" in self.death:
            raise TargetDied(f"{self.death}: {self.log_tail()}")
        if self.proc.poll() is not None:
            raise TargetDied(f"target died: exited with status {self.proc.returncode} (port {self.port}): "
                             f"{self.log_tail()}")
        owner = listener_pid(self.port) if self.listener_check else self.pgid
        if owner is None or group_of(owner) != self.pgid:
            raise TargetDied(f"target died: nothing of process group {self.pgid} listens on port {self.port} any more"
                             f" ({'pid ' + str(owner) + ' does' if owner else 'nobody does'}): {self.log_tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the target's process group, then SIGKILL it if it has not exited in grace_s; signals that
        arrive meanwhile are held until it is done, so an impatient Ctrl-C cannot leave an orphan."""
        self._stopping.set()
        if self.proc is None:
            return
        with held_signals():
            stop_group(self.proc.pid, grace_s, reap=self.proc.poll)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(5)

    def log_tail(self, lines: int = 5) -> str:
        """The last lines of the target's log, on one line."""
        try:
            return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "TargetProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_holding: list[bool] = []  # non-empty while the main thread holds signals (blocks nest)


@contextlib.contextmanager
def held_signals() -> Iterator[None]:
    """SIGINT and SIGTERM are held (delivered as KeyboardInterrupt at the end) while the block runs."""
    if threading.current_thread() is not threading.main_thread() or _holding:
        yield  # another thread cannot set handlers; an outer block already holds them
        return
    caught: list[int] = []
    previous: dict[int, Any] = {}
    try:  # a signal landing while the handlers are swapped still leaves them restored and _holding clear
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
        _holding.append(True)
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if _holding:
            _holding.pop()
        if caught:
            raise KeyboardInterrupt(f"signal {caught[0]}")


def stop_group(pgid: int, grace_s: float = 15.0, started_after: float | None = None,
               reap: Callable[[], object] | None = None) -> bool:
    """Stop one process group (SIGTERM, then SIGKILL); False if it was already gone.

    started_after: only when a process of the group started after this time (so a recycled group id
    from a long-dead launch is never signalled). reap: our own child's poll, so its zombie leaves the group."""
    if started_after is not None and not _group_started_after(pgid, started_after):
        return False
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if reap is not None:
            reap()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)  # anything of the group still alive
    return True


def _group_started_after(pgid: int, when: float) -> bool:
    for proc in psutil.process_iter(["pid", "create_time"]):
        with contextlib.suppress(psutil.Error, ProcessLookupError):
            if os.getpgid(proc.pid) == pgid and proc.info["create_time"] >= when - 2.0:
                return True
    return False
