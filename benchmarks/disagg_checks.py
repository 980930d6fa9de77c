"""Issue 9's disaggregation checks on the real model: outputs equal to the colocated engine's, and a decode
worker killed under load.

    PYTHONPATH=src .venv/bin/python benchmarks/disagg_checks.py [--requests 16] [--json out.json]

Equivalence: the 16 prompts of tp_equivalence.py, greedy, 32 tokens each, through the router + one prefill
and one decode worker, per store (shm, tcp) × transfer mode × implementation, against one colocated engine.
Worker death: `infragent serve --disagg --decode-workers 2` in a subprocess, --requests concurrent streaming
requests; once one request has streamed tokens, SIGKILL a decode worker (its pid from the server log). Counted:
completed, failed with an error naming the dead worker, anything else (hung or other errors: must be 0);
then /health and one more request.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx

from infragent.engine.config import EngineConfig
from infragent.engine.disagg.offline import generate
from infragent.engine.disagg.router import DisaggConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams

sys.path.insert(0, os.path.dirname(__file__))
from tp_equivalence import PROMPTS  # noqa: E402

CONFIG = dict(model="llama", num_threads=1, kv_cache_gb=0.2, max_model_len=1024)


def equivalence() -> list[dict]:
    """Identical outputs per store × mode × implementation."""
    params = SamplingParams(max_tokens=32, ignore_eos=True)
    reference = LLMEngine(EngineConfig(**CONFIG))
    seqs = [reference.add_request(p, params) for p in PROMPTS]
    while reference.has_unfinished():
        reference.step()
    rows = []
    for store, mode, impl in [("shm", "layerwise", "bulk"), ("shm", "layerwise", "serialize"),
                              ("shm", "after_prefill", "bulk"), ("tcp", "layerwise", "bulk")]:
        config = EngineConfig(**CONFIG, kv_transfer_mode=mode, kv_transfer_impl=impl)
        out = generate(config, DisaggConfig(kv_store=store), PROMPTS, params)
        same = sum(o.text == s.text and o.completion_tokens == len(s.output_token_ids) for o, s in zip(out, seqs))
        rows.append({"store": store, "mode": mode, "impl": impl, "identical": same, "prompts": len(PROMPTS)})
        print(f"equivalence  {store:<4} {mode:<14} {impl:<10} identical {same}/{len(PROMPTS)}", flush=True)
    return rows


def worker_death(requests: int) -> dict:
    """Kill a decode worker while requests stream; count what each request got."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(f"/tmp/disagg-checks-{port}.log", "w+")
    server = subprocess.Popen([sys.executable, "-m", "infragent.cli", "serve", "--model", "llama", "--port", str(port),
                               "--threads", "1", "--kv-cache-gb", "0.2", "--max-model-len", "1024", "--disagg",
                               "--decode-workers", "2"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: httpx.get(f"{url}/health", timeout=1).status_code == 200, 300)
        log.seek(0)
        pids = [int(p) for p in re.findall(r"decode worker \d+ \(pid (\d+)\) ready", log.read())]
        streamed, results = threading.Event(), {}

        def ask(i: int) -> None:
            body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": 64, "ignore_eos": True,
                    "stream": True}
            text = ""
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
                    for line in r.iter_lines():
                        text += line
                        if '"text"' in line:
                            streamed.set()
                results[i] = "error" if '"error"' in text else "ok" if "[DONE]" in text else "other"
                results[i, "text"] = text
            except httpx.HTTPError as err:
                results[i] = f"other: {err}"

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(requests)]
        for t in threads:
            t.start()
        streamed.wait(120)
        victim = pids[-1]
        os.kill(victim, signal.SIGKILL)
        for t in threads:
            t.join(180)
        outcomes = [results.get(i, "hung") for i in range(requests)]
        named = sum(1 for i in range(requests) if outcomes[i] == "error" and f"pid {victim}" in results[i, "text"])
        health = httpx.get(f"{url}/health", timeout=5).status_code
        after = httpx.post(f"{url}/v1/completions", json={"prompt": "Hi", "max_tokens": 8}, timeout=60)
        row = {"requests": requests, "ok": outcomes.count("ok"), "errors_naming_dead_worker": named,
               "other": requests - outcomes.count("ok") - named, "health_after": health,
               "request_after": after.status_code}
        print(f"worker death  {row}", flush=True)
        return row
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(60)


def _wait(ready, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if ready():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError("server did not become healthy")


def main() -> None:
    """Run both checks; print and optionally save them."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    result = {"equivalence": equivalence(), "worker_death": worker_death(args.requests)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
