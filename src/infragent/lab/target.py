"""The target runner: launch a target with knob values in its own process group, wait until it is ready,
capture its logs, and stop it by that process group only (never a broad kill)."""
from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from infragent.lab.spec import Target

# Engine knobs that `infragent serve` takes as flags.
SERVE_FLAGS = {"max_num_seqs": "--max-num-seqs", "max_num_batched_tokens": "--max-num-batched-tokens",
               "max_model_len": "--max-model-len", "block_size": "--block-size", "kv_cache_gb": "--kv-cache-gb",
               "num_threads": "--threads", "kv_layout": "--kv-layout", "gemm": "--gemm",
               "kv_cache_dtype": "--kv-cache-dtype", "kv_cache_dtypes": "--kv-cache-dtypes",
               "quantization": "--quantization", "smoothquant_alpha": "--smoothquant-alpha",
               "speculative": "--speculative", "num_speculative_tokens": "--num-speculative-tokens",
               "rollback": "--rollback", "kda_decode_impl": "--kda-decode-impl", "kda_bv_tile": "--kda-bv-tile",
               "kda_head_split": "--kda-head-split", "tensor_parallel_size": "--tp",
               "tp_partial_precision": "--tp-partial-precision", "pipeline_parallel_size": "--pp",
               "kv_transfer_mode": "--kv-transfer-mode", "kv_transfer_impl": "--kv-transfer-impl"}


def flag_value(name: str, value: str) -> Any:
    """A serve flag's text as the EngineConfig field's type (int, float, str, comma list; "none" → None)."""
    from infragent.engine.config import EngineConfig

    kind = str(EngineConfig.__dataclass_fields__[name].type)
    if value == "none" and "None" in kind:
        return None
    for prefix, convert in (("list", lambda v: v.split(",")), ("int", int), ("float", float), ("bool", _bool)):
        if kind.startswith(prefix):
            return convert(value)
    return value


def _bool(value: str) -> bool:
    return value.lower() in ("1", "true", "yes")


def engine_config(target: Target, knobs: dict[str, Any]) -> Any:
    """The EngineConfig an engine target's server would run with these knobs (its serve_args applied)."""
    import json

    from infragent.engine.config import EngineConfig, HybridConfig

    fields: dict[str, Any] = {"model": target.model}
    by_flag = {flag: name for name, flag in SERVE_FLAGS.items()}
    args = list(target.serve_args)
    while args:
        flag = args.pop(0)
        value = args.pop(0) if args and not args[0].startswith("--") else "true"
        if flag == "--hybrid-config":
            fields["hybrid"] = HybridConfig(**json.loads(value))
        elif flag in by_flag:
            fields[by_flag[flag]] = flag_value(by_flag[flag], value)
    fields.update(knobs)
    return EngineConfig(**fields)


class TargetError(RuntimeError):
    """The target did not start or become ready; the message carries the tail of its log."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(target: Target, knobs: dict[str, Any]) -> tuple[list[str], str, str]:
    """(argv, base_url, ready_url) for a target with these knob values."""
    if target.kind == "command":
        try:
            command = target.command.format(**knobs)  # type: ignore[union-attr]
        except KeyError as err:
            raise TargetError(f"target.command: no value for knob {err}") from None
        return shlex.split(command), target.base_url, target.ready_url  # type: ignore[return-value]
    unknown = [k for k in knobs if k not in SERVE_FLAGS]
    if unknown:
        raise TargetError(f"knobs {unknown}: not settable on the engine server; settable: {', '.join(SERVE_FLAGS)}")
    port = _free_port()
    argv = [sys.executable, "-m", "infragent.cli", "serve", "--model", target.model, "--port", str(port),
            *target.serve_args]
    for name, value in knobs.items():
        text = "none" if value is None else ",".join(value) if isinstance(value, list) else str(value)
        argv += [SERVE_FLAGS[name], text]
    url = f"http://127.0.0.1:{port}"
    return argv, url, f"{url}/health"


class TargetProcess:
    """A running target; use as a context manager."""

    def __init__(self, target: Target, knobs: dict[str, Any], log_path: str | Path) -> None:
        self.argv, self.base_url, self.ready_url = launch_command(target, knobs)
        self.timeout = target.ready_timeout_s
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen | None = None

    def start(self) -> "TargetProcess":
        """Launch (new session = new process group) and wait for the readiness URL to answer 200."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log.close()
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise TargetError(f"target exited with status {self.proc.returncode} before it was ready: "
                                  f"{self.log_tail()}")
            try:
                if httpx.get(self.ready_url, timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise TargetError(f"target not ready at {self.ready_url} after {self.timeout:.0f}s: {self.log_tail()}")

    @property
    def pgid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None  # session leader: its pid is the group id

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the target's process group, then SIGKILL it if it has not exited in grace_s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            pass
        except ProcessLookupError:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything of the group still alive
        except ProcessLookupError:
            pass
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


def stop_group(pgid: int, grace_s: float = 15.0) -> bool:
    """Stop one process group (SIGTERM, then SIGKILL); False if it was already gone."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return True
