"""The outside referee: guidellm (0.8.1, not written here) and `infragent loadgen` against the same server,
in interleaved runs, their metric definitions mapped onto each other.

    PYTHONPATH=src .venv/bin/python benchmarks/referee_guidellm.py [--pairs 12] [--requests 30] [--json out.json]

guidellm runs from its own virtual environment (.infragent/guidellm-venv, made on first use: torch 2.13.0
CPU first, then guidellm), with this project's tokenizer handed to it as a Hugging Face tokenizer folder
written from the GGUF (Tokenizer.save_hf). Both send the same workload to one real-model server
(`infragent serve --model llama --threads 1`, pinned to core 0; both tools run on core 1): one request at a time, `--input` prompt tokens, `--output`
output tokens with ignore_eos, streamed from /v1/completions. Each pair runs both tools in a random order.

Mapping (per request, then the mean over requests): guidellm's time_to_first_token_ms is loadgen's TTFT;
guidellm's inter_token_latency_ms, (last token - first token) / (output - 1), is loadgen's (and vLLM's)
TPOT; guidellm's time_per_output_token_ms includes the TTFT and has no loadgen counterpart. Both send the
same sampling: guidellm sends no temperature by default (the server's 1.0, sampled) while loadgen sends 0
(greedy), and sampling over the vocabulary cost the server about 4% more per token, so guidellm is given
temperature 0 through its backend extras. Reported: the
per-pair ratios guidellm/loadgen of the TTFT mean and the TPOT mean, with a 95% t interval of their
geometric mean; the must-show is agreement within 5%. The server's own means over each tool's run (its
/metrics TTFT and inter-token histograms' sum/count) referee both: a tool/server ratio near 1 means the
tool measured what the server did, and a difference between the tools is then the server's (each tool's
own CPU use on 2 cores slows the server a little).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import numpy as np

from disagg_serving import start  # benchmarks/: the real-model server on a free port
from infragent.analysis.stats import t_interval
from infragent.engine.tokenizer import Tokenizer
from infragent.probes.loadgen import LoadConfig, run_loadgen

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".infragent" / "guidellm-venv"
GUIDELLM = "guidellm==0.8.1"


def guidellm_exe() -> Path:
    """guidellm's command, installed into its own venv the first time (torch pinned first: an unpinned one
    would pull a multi-GB CUDA build)."""
    exe = VENV / "bin" / "guidellm"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        pip = [str(VENV / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run(pip + ["--upgrade", "pip"], check=True)
        subprocess.run(pip + ["torch==2.13.0"], check=True)
        subprocess.run(pip + [GUIDELLM], check=True)
    return exe


def server_means(url: str) -> dict[str, float]:
    """The server's TTFT and inter-token histograms' (sum, count), as read now."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    values = {}
    for line in text.splitlines():
        for name in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            for part in ("sum", "count"):
                if line.startswith(f"infragent:{name}_{part} "):
                    values[f"{name}_{part}"] = float(line.split()[-1])
    return values


def server_view(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The server's own TTFT and inter-token means (ms) over the requests between two readings."""
    def mean(name: str) -> float:
        count = after[f"{name}_count"] - before[f"{name}_count"]
        return 1e3 * (after[f"{name}_sum"] - before[f"{name}_sum"]) / count if count else math.nan
    return {"ttft_ms": mean("time_to_first_token_seconds"), "tpot_ms": mean("inter_token_latency_seconds")}


def run_guidellm(exe: Path, url: str, tokenizer: Path, args: argparse.Namespace, out: Path,
                 seed: int) -> dict[str, float]:
    """One guidellm run: synchronous requests, prompts from seed (a fresh one per run: guidellm's default
    seed repeats its prompts, and a second run is served from the prefix cache); the means of its
    per-request TTFT and ITL (ms)."""
    scenario = {"spec": {
        "backend": {"kind": "openai_http", "target": url, "model": "llama", "request_format": "/v1/completions",
                    "extras": {"body": {"temperature": 0.0}}},
        "profile": {"kind": "concurrent", "streams": [1]},
        "tokenizer": {"kind": "huggingface_auto", "model": str(tokenizer)},
        "data": [{"kind": "synthetic_text", "prompt_tokens": args.input, "output_tokens": args.output}],
        "constraints": [{"kind": "max_requests", "count": args.requests}],
        "seed": {"kind": "static", "value": seed},
        "outputs": [{"kind": "json", "path": str(out)}]}}
    path = out.with_suffix(".scenario.json")
    path.write_text(json.dumps(scenario))
    done = subprocess.run([str(exe), "run", "--scenario", str(path), "--disable-console-interactive"],
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"guidellm failed ({done.returncode}): {done.stderr[-2000:] or done.stdout[-2000:]}")
    rows = list(_request_stats(json.loads(out.read_text())))
    if not rows:
        raise RuntimeError(f"guidellm's {out} holds no per-request stats")
    return {"ttft_ms": float(np.mean([r["time_to_first_token_ms"] for r in rows])),
            "tpot_ms": float(np.mean([r["inter_token_latency_ms"] for r in rows])), "requests": len(rows)}


def _request_stats(node: object):  # noqa: ANN202 - generator of per-request dicts
    """Every successful request's stats in guidellm's report: dicts with numeric TTFT and ITL."""
    if isinstance(node, dict):
        ttft, itl = node.get("time_to_first_token_ms"), node.get("inter_token_latency_ms")
        if isinstance(ttft, (int, float)) and isinstance(itl, (int, float)):
            yield node
            return
        for key, value in node.items():
            if key not in ("errored", "incomplete"):
                yield from _request_stats(value)
    elif isinstance(node, list):
        for item in node:
            yield from _request_stats(item)


def client_cpu_s() -> float:
    """CPU seconds used so far by this process (loadgen runs in it) and its finished children (guidellm)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_loadgen_once(url: str, args: argparse.Namespace) -> dict[str, float]:
    """One loadgen run with the same workload; the means of its per-request TTFT and TPOT (ms)."""
    feedback = run_loadgen(LoadConfig(base_url=url, model="llama", num_prompts=args.requests, max_concurrency=1,
                                      random_input_len=args.input, random_output_len=args.output, warmup=1,
                                      progress=False))
    records = [r for r in json.loads(Path(feedback.evidence[0].path).read_text())["runs"][0]["records"]
               if r["success"] and not r["warmup"]]
    return {"ttft_ms": 1e3 * float(np.mean([r["ttft_s"] for r in records])),
            "tpot_ms": 1e3 * float(np.mean([(r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
                                            for r in records])), "requests": len(records)}


def _ratio(pairs: list[dict], metric: str, num: str, den: str, over: tuple[str, str] | None = None) -> dict:
    """The geometric mean over pairs of num/den (each first divided by the server's own mean during its run,
    with over = the two server views) and its 95% t interval."""
    logs = []
    for p in pairs:
        value = math.log(p[num][metric] / p[den][metric])
        if over is not None:
            value -= math.log(p[over[0]][metric] / p[over[1]][metric])
        logs.append(value)
    lo, hi = t_interval(logs) or (math.nan, math.nan)
    return {"ratio": math.exp(float(np.mean(logs))), "ci": [math.exp(lo), math.exp(hi)]}


def summarize(pairs: list[dict]) -> dict:
    """Every ratio the referee reports, printed: the tools against each other as measured, each tool against
    the server over its own run, and the tools against each other with the server's run-to-run change taken
    out (what each tool read of what the server did)."""
    summary = {}
    rows = (("guidellm/loadgen", "guidellm", "loadgen", None),
            ("guidellm/server", "guidellm", "server during guidellm", None),
            ("loadgen/server", "loadgen", "server during loadgen", None),
            ("guidellm/loadgen, each over the server in its run", "guidellm", "loadgen",
             ("server during guidellm", "server during loadgen")))
    for metric in ("ttft_ms", "tpot_ms"):
        for label, num, den, over in rows:
            row = summary[f"{metric} {label}"] = _ratio(pairs, metric, num, den, over)
            print(f"{metric.removesuffix('_ms').upper()} mean, {label}: x{row['ratio']:.3f} "
                  f"[{row['ci'][0]:.3f}, {row['ci'][1]:.3f}] over {len(pairs)} pairs")
    return summary


def main() -> None:
    """Interleave the two tools; print each pair and the ratios with their intervals."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=12)
    parser.add_argument("--requests", type=int, default=30)
    parser.add_argument("--input", type=int, default=128)
    parser.add_argument("--output", type=int, default=32)
    parser.add_argument("--json", default=None)
    parser.add_argument("--from-json", default=None, help="summarize an earlier run's JSON instead of running")
    args = parser.parse_args()
    if args.from_json:
        summarize(json.loads(Path(args.from_json).read_text())["pairs"])
        return
    exe = guidellm_exe()
    work = Path(tempfile.mkdtemp(prefix="referee-"))
    tokenizer = Tokenizer.from_gguf().save_hf(work / "tokenizer")
    # The server on core 0, every client (this process, guidellm's processes) on core 1: a tool's own CPU
    # use then cannot slow the server it measures (guidellm's is larger than loadgen's).
    os.sched_setaffinity(0, {0})
    proc, url = start(["--threads", "1"])
    os.sched_setaffinity(0, {1})
    order = random.Random(0)
    pairs = []
    try:
        run_loadgen_once(url, argparse.Namespace(**{**vars(args), "requests": 2}))  # warm the server
        for k in range(args.pairs):
            pair = {}
            for tool in order.sample(["guidellm", "loadgen"], 2):
                before, cpu = server_means(url), client_cpu_s()
                pair[tool] = (run_guidellm(exe, url, tokenizer, args, work / f"guidellm-{k}.json", 1000 + k)
                              if tool == "guidellm" else run_loadgen_once(url, args))
                pair[tool]["client_cpu_s"] = client_cpu_s() - cpu
                pair[f"server during {tool}"] = server_view(before, server_means(url))
            pairs.append(pair)
            print(f"pair {k}: guidellm TTFT {pair['guidellm']['ttft_ms']:.1f} ms, ITL {pair['guidellm']['tpot_ms']:.2f} "
                  f"ms | loadgen TTFT {pair['loadgen']['ttft_ms']:.1f} ms, TPOT {pair['loadgen']['tpot_ms']:.2f} ms",
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    summary = summarize(pairs)
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "pairs": pairs, "args": vars(args)}, indent=1))


if __name__ == "__main__":
    main()
