"""Real servers on loopback for the tests: in a thread (fast to start) or as a subprocess (for RSS, SIGTERM)."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import httpx

from infragent.engine.config import EngineConfig, HybridConfig

TINY_HYBRID = dict(hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32,
                   kda_num_heads=4, kda_head_k_dim=32, kda_head_v_dim=32)
# Wide enough that a decode step's forward, which batching shares, outweighs the per-token HTTP work it does
# not: max_num_seqs then has an effect a loaded machine cannot hide.
WIDE_HYBRID = dict(TINY_HYBRID, hidden_size=512, intermediate_size=1536, num_heads=8, num_kv_heads=4, head_dim=64,
                   kda_num_heads=8, kda_head_k_dim=64, kda_head_v_dim=64)
# Eight requests at a time against a max_num_seqs knob: the scenario where batching shows (e2e latency).
CONCURRENT = """
[[scenarios]]
name = "c8"
num_prompts = 16
max_concurrency = 8
random_input_len = 48
random_output_len = 12
repeats = 2

[[criteria]]
scenario = "c8"
metric = "e2el_median_ms"
max_regression = 0.05
"""
SRC = Path(__file__).resolve().parent.parent / "src"


def free_port() -> int:
    """An unused TCP port on loopback."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tiny_config(**knobs: object) -> EngineConfig:
    """A small random-init hybrid model: real KV blocks and KDA state slots, fast on 2 cores."""
    knobs.setdefault("max_model_len", 512)
    knobs.setdefault("kv_cache_gb", 0.05)
    return EngineConfig(model="hybrid", hybrid=HybridConfig(**TINY_HYBRID), num_threads=1, **knobs)


def wait_healthy(url: str, timeout: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll /health until it answers 200 (failing at once, with its output, if proc exits first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            output = proc.stdout.read() if proc.stdout else ""
            raise RuntimeError(f"server at {url} exited with {proc.returncode} before it was healthy:\n{output}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.1)
    raise TimeoutError(f"server at {url} did not become healthy in {timeout}s")


@contextlib.contextmanager
def thread_server(api_key: str | None = None, max_waiting: int = 256, disagg: object = None,
                  config: EngineConfig | None = None, max_request_bytes: int = 4 * 1024 * 1024,
                  profile_dir: str | None = None, **knobs: object) -> Iterator[str]:
    """Start make_server in a thread (with disagg: a DisaggConfig, the router and its workers) on config (by
    default the tiny hybrid model with knobs); yield its base URL; stop it."""
    from infragent.engine.server.serve import make_server

    port = free_port()
    server = make_server(config or tiny_config(**knobs), port=port, api_key=api_key, max_waiting=max_waiting,
                         shutdown_timeout_s=5, disagg=disagg, max_request_bytes=max_request_bytes,
                         profile_dir=profile_dir)
    with in_thread(server, port) as url:
        yield url


@contextlib.contextmanager
def in_thread(server: object, port: int) -> Iterator[str]:
    """Run a uvicorn Server in a daemon thread; yield its base URL once /health answers; stop it."""
    thread = threading.Thread(target=server.run, daemon=True)  # type: ignore[attr-defined]
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        yield url
    finally:
        server.should_exit = True  # type: ignore[attr-defined]
        thread.join(30)


@contextlib.contextmanager
def process_server(*extra: str) -> Iterator[tuple[str, subprocess.Popen]]:
    """`infragent serve` in a subprocess with the tiny hybrid model; yield (base URL, process)."""
    port = free_port()
    cmd = [sys.executable, "-m", "infragent.cli", "serve", "--model", "hybrid", "--port", str(port),
           "--hybrid-config", json.dumps(TINY_HYBRID), "--max-model-len", "512", "--kv-cache-gb", "0.05",
           "--threads", "1", *extra]
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        # a server of several processes (EP ranks, disaggregated workers) each importing torch can take
        # minutes to come up on a loaded 2-core machine; a health wait is not a timing assertion
        wait_healthy(url, timeout=240.0, proc=proc)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def metric(url: str, name: str, labels: str = "") -> float:
    """One sample from /metrics (0.0 when absent)."""
    text = httpx.get(f"{url}/metrics", timeout=5).text
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


def tiny_target_toml(hybrid: dict = TINY_HYBRID) -> str:
    """The [target] table of a spec that serves a small hybrid model (for measure/report tests)."""
    return ('[target]\nkind = "engine"\nmodel = "hybrid"\nserve_args = ["--hybrid-config", '
            f"'{json.dumps(hybrid)}', "
            '"--max-model-len", "512", "--kv-cache-gb", "0.05", "--threads", "1"]\n')


def sigterm_mid_stream(url: str, proc: subprocess.Popen) -> list[str]:
    """Stream one 60-token request, send SIGTERM once it runs, and return the SSE lines it got."""
    import signal

    lines: list[str] = []

    def stream() -> None:
        body = {"prompt": "count", "max_tokens": 60, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as response:
            lines.extend(response.iter_lines())
    reader = threading.Thread(target=stream)
    reader.start()
    deadline = time.monotonic() + 20
    while metric(url, "infragent:num_requests_running") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    reader.join(60)
    return lines
