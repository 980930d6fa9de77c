"""Engine throughput benchmark: infragent (weights fp32; weight_format auto, the default path; as the file's gguf
blocks with fp32 activations or activations as two or one int8 digits (gguf-a16, gguf-a8), each also held to
AVX2; int8) vs transformers vs llama.cpp on SmolLM2-135M, plus the roofline and, per infragent engine, the
floor under its peak memory. An infragent engine's name may carry its KV cache's dtype
(infragent-gguf-a16-kv-int8; default: the model's fp32).

Each engine runs in its own fresh subprocess per round (rounds interleave engines), so peak RSS is
per engine. Usage:
    PYTHONPATH=src .venv/bin/python benchmarks/engine_throughput.py [--repeats 3] [--quick] [--json out.json]
"""
from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_prompts import encode_corpus, make_windows, round_spec  # noqa: E402
from throughput_report import format_report, summarize  # noqa: E402

ENGINES = ("infragent", "infragent-auto", "infragent-gguf", "infragent-gguf-avx2", "infragent-gguf-a16", "infragent-gguf-a16-avx2",
           "infragent-gguf-a8", "infragent-gguf-a8-avx2", "infragent-int8", "transformers", "transformers-avx2",
           "llamacpp")  # -avx2: the process held to AVX2 (kernels, ATen, MKL, oneDNN), as on an AVX2-only CPU
IMPORT_NAME = {"transformers": "transformers", "llamacpp": "llama_cpp"}  # the rest: infragent
KV_DTYPES = ("fp32", "bf16", "fp8", "int8")  # infragent-gguf-a16-kv-int8[-avx2]: the KV cache in int8
CONCURRENCY = {"c1": 1, "c8": 8, "c32": 32}


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=None, help="rounds per engine (default 3; 2 with --quick)")
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of " + ",".join(ENGINES))
    p.add_argument("--quick", action="store_true", help="smoke test: 32-token prompts, 16 new tokens, 128 prefill")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None, help="write raw samples and environment here")
    p.add_argument("--timeout", type=float, default=3600, help="seconds allowed per engine subprocess")
    return p.parse_args()


def environment(threads: int) -> dict:
    """Versions, CPU, git commit and load: what a reader needs to trust or discount the numbers."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=HERE, capture_output=True, text=True).stdout.strip()
        except OSError:
            return ""

    versions = {}
    for dist in ("transformers", "accelerate", "llama_cpp_python", "numpy"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {"torch": torch.__version__, "python": platform.python_version(), "threads": threads,
            "cpu_model": cpu, "cpu_count": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)),
            "git_commit": git("rev-parse", "HEAD"), "git_dirty": bool(git("status", "--porcelain")),
            "versions": versions, "loadavg_start": os.getloadavg()}


def base_engine(name: str) -> str:
    """The engine a name runs, without its KV dtype (infragent-gguf-kv-bf16-avx2 -> infragent-gguf-avx2); a
    name whose KV part is not a KV dtype, or is not an infragent engine's, stays as it is (and is refused)."""
    stem, avx2 = (name.removesuffix("-avx2"), "-avx2") if name.endswith("-avx2") else (name, "")
    engine, _, kv = stem.partition("-kv-")
    return engine + avx2 if kv in KV_DTYPES and engine.startswith("infragent") else name


def available(engine: str) -> bool:
    """Whether the engine's Python package can be imported here (without importing it)."""
    return importlib.util.find_spec(IMPORT_NAME.get(engine.removesuffix("-avx2"), "infragent")) is not None


def child_env(threads: int) -> dict[str, str]:
    """Environment for a child: the same thread count for every BLAS/OpenMP runtime, src on the path."""
    env = dict(os.environ)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def run_child(engine: str, spec: dict, timeout: float, env: dict[str, str]) -> dict:
    """Run one engine in a fresh process on one round's spec; return its JSON result."""
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        start = time.perf_counter()
        try:
            proc = subprocess.run([sys.executable, str(HERE / "engine_worker.py"), engine, str(spec_path),
                                   str(out_path)], env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"engine": engine, "error": f"timed out after {timeout:.0f}s"}
        if not out_path.is_file():
            return {"engine": engine, "error": f"exit {proc.returncode}: {proc.stderr[-1500:]}"}
        result = json.loads(out_path.read_text())
        result["process_wall_s"] = time.perf_counter() - start
        return result


def run_peaks(threads: int, quick: bool, env: dict[str, str]) -> dict:
    """Machine roofline numbers from a fresh process with the benchmark's thread count."""
    cmd = [sys.executable, str(HERE / "machine_peaks.py"), "--json", "--threads", str(threads)]
    out = subprocess.run(cmd + (["--quick"] if quick else []), env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    """Run the rounds, then print the table and optionally write the raw JSON."""
    args = parse_args()
    from infragent.engine.gguf_weights import default_gguf_path

    repeats = args.repeats or (2 if args.quick else 3)
    prompt_len, max_tokens, prefill_len = (32, 16, 128) if args.quick else (128, 128, 512)
    engines, skipped = [], {}
    for name in [e.strip() for e in args.engines.split(",") if e.strip()]:
        if base_engine(name) not in ENGINES:
            sys.exit(f"--engines: unknown engine {name!r}; choose from {', '.join(ENGINES)}, an infragent one "
                     f"optionally with -kv-{'/'.join(KV_DTYPES)} before any -avx2 (its KV cache in that dtype)")
        if available(name):
            engines.append(name)
        else:
            extra = {"transformers": "pip install 'infragent[compare]'",
                     "llamacpp": "pip install 'infragent[llamacpp]'"}.get(name, "")
            skipped[name] = f"{IMPORT_NAME.get(name, 'infragent')} is not importable; skipped ({extra})"
            print(f"note: {skipped[name]}", flush=True)
    gguf_path = str(default_gguf_path())
    stream, tokenizer_used = encode_corpus(gguf_path)
    per_round = 4 + sum(CONCURRENCY.values()) + 1
    windows = make_windows(stream, per_round * repeats, max(prompt_len, prefill_len))
    config = {"repeats": repeats, "prompt_len": prompt_len, "max_tokens": max_tokens, "prefill_len": prefill_len,
              "concurrency": CONCURRENCY, "engines": engines, "skipped": skipped, "gguf_path": gguf_path,
              "quick": args.quick, "corpus_tokens": len(stream), "prompt_tokenizer": tokenizer_used}
    env_info = environment(args.threads)
    env = child_env(args.threads)
    rounds = []
    for r in range(repeats):
        spec = round_spec(windows, CONCURRENCY, prompt_len, prefill_len)
        spec.update(threads=args.threads, max_tokens=max_tokens, gguf_path=gguf_path)
        record = {"round": r, "peaks": run_peaks(args.threads, args.quick, env), "engines": {}}
        order = engines[r % len(engines):] + engines[:r % len(engines)] if engines else []
        for engine in order:  # rotate the order so no engine always runs first
            print(f"round {r + 1}/{repeats}: {engine} ...", flush=True)
            record["engines"][engine] = run_child(engine, spec, args.timeout, env)
            if "error" in record["engines"][engine]:
                print(f"  {engine} failed: {record['engines'][engine]['error'][-800:]}", flush=True)
        rounds.append(record)
    env_info["loadavg_end"] = os.getloadavg()
    summary = summarize(rounds, engines, config)
    print(format_report(summary, config, env_info))
    if args.json:
        args.json.write_text(json.dumps({"environment": env_info, "config": config, "rounds": rounds,
                                         "summary": summary}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
