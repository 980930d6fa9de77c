"""Where a prefill's time goes, per engine: linears (and their GFLOP/s against this machine's fp32 matmul peak),
attention, the LM head, other ops, and time in no op at all (Python between launches).

    PYTHONPATH=src .venv/bin/python benchmarks/prefill_anatomy.py [--tokens 512] [--repeats 5]
        [--engines gguf,fp32,transformers] [--rows 0] [--json out.json]

Each engine runs in a fresh process: load, warm up, then `repeats` prefills of distinct real-text windows timed
without the profiler (the figure), then the same number under torch.profiler (the anatomy: each op's self time,
summed). --rows N times a decode-shaped step instead: N sequences of 128-token prompts, prefilled untimed, then
one step of N decode rows, repeated.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_prompts import encode_corpus, make_windows  # noqa: E402
from engine_throughput import child_env  # noqa: E402

LINEAR_OPS = ("infragent::qlinear", "infragent::dense_linear", "infragent::qlinear_a8", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::matmul", "aten::linear")
ATTENTION_OPS = ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
                 "infragent::paged_attention", "aten::_scaled_dot_product_attention_math", "aten::softmax",
                 "aten::_softmax")
WRAPPERS = ("aten::linear", "aten::matmul", "aten::scaled_dot_product_attention")  # self time ~0; not double-counted


def parse_args() -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--engines", default="gguf,fp32,transformers")
    p.add_argument("--rows", type=int, default=0, help="time a decode step of this many rows instead")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--spec", type=Path, default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def categorize(events: list[tuple[str, float]]) -> dict[str, float]:
    """Seconds per category from (op name, self seconds) pairs."""
    out = {"linears": 0.0, "attention": 0.0, "other ops": 0.0}
    for name, seconds in events:
        if name in WRAPPERS:
            key = "linears" if name != "aten::scaled_dot_product_attention" else "attention"
        elif name in LINEAR_OPS:
            key = "linears"
        elif name in ATTENTION_OPS or "attention" in name:
            key = "attention"
        else:
            key = "other ops"
        out[key] += seconds
    return out


def profile(run, repeats: int) -> tuple[list[float], dict[str, float], list[tuple[str, float]]]:
    """Wall seconds of `repeats` unprofiled calls of run(i), then the per-call seconds per category and the top
    ops by self time over `repeats` profiled calls."""
    import torch

    walls = []
    for i in range(repeats):
        start = time.perf_counter()
        run(i)
        walls.append(time.perf_counter() - start)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for i in range(repeats):
            run(repeats + i)
        profiled = time.perf_counter() - start
    events = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
    cats = {k: v / repeats for k, v in categorize(events).items()}
    cats["no op (Python, waits)"] = max(0.0, profiled / repeats - sum(cats.values()))
    top = sorted(((k, s / repeats) for k, s in events), key=lambda kv: -kv[1])[:12]
    return walls, cats, top


def child_infragent(spec: dict, weight_format: str) -> dict:
    """One infragent engine: prefill (or decode-step) timings and anatomy."""
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    llm = LLM(model="llama", max_num_seqs=max(32, spec["rows"]), max_num_batched_tokens=512,
              num_threads=spec["threads"], weight_format=weight_format)
    engine = llm.engine
    one = SamplingParams(max_tokens=1, ignore_eos=True)
    prompts = spec["prompts"]
    if spec["rows"]:  # a running batch of N sequences, prefilled untimed; each timed call is one decode step
        for ids in prompts[:spec["rows"]]:
            engine.add_request(ids, SamplingParams(max_tokens=1024, ignore_eos=True))
        while engine.scheduler.waiting or any(s.num_computed_tokens < len(s.prompt_token_ids)
                                              for s in engine.scheduler.running):
            engine.step()
        for _ in range(3):
            engine.step()

        def run(i: int) -> None:
            engine.step()
    else:
        llm.generate([prompts[-1]], one)  # warm-up

        def run(i: int) -> None:
            llm.generate([prompts[i]], one)
    walls, cats, top = profile(run, spec["repeats"])
    return {"engine": f"infragent-{weight_format}", "walls": walls, "categories": cats, "top": top,
            "weight_choice": engine.weight_choice.to_dict()}


def child_transformers(spec: dict) -> dict:
    """transformers on the same GGUF: a prefill is generate() of one new token, as engine_worker.py times it."""
    import torch
    from engine_worker import load_transformers

    model = load_transformers(spec)
    pad = model.config.eos_token_id

    def run(i: int) -> None:
        with torch.inference_mode():
            model.generate(input_ids=torch.tensor([spec["prompts"][i]]), do_sample=False, pad_token_id=pad,
                           max_new_tokens=1, min_new_tokens=1)

    run(len(spec["prompts"]) - 1)
    walls, cats, top = profile(run, spec["repeats"])
    return {"engine": "transformers", "walls": walls, "categories": cats, "top": top}


def linear_flops(tokens: int) -> float:
    """FLOPs of SmolLM2-135M's linears for `tokens` rows, plus the LM head on one row."""
    hidden, inter, kv, layers, vocab = 576, 1536, 192, 30, 49152
    per_layer = hidden * (hidden + 2 * kv) + hidden * hidden + 3 * hidden * inter
    return 2.0 * tokens * per_layer * layers + 2.0 * hidden * vocab


def main() -> None:
    """Spawn one child per engine; print the table; optionally write the JSON."""
    args = parse_args()
    if args.child:
        spec = json.loads(args.spec.read_text())
        result = child_transformers(spec) if args.child == "transformers" else child_infragent(spec, args.child)
        print(json.dumps(result))
        return
    from infragent.engine.gguf_weights import default_gguf_path
    from infragent.probes.machine import measure_peaks

    gguf_path = str(default_gguf_path())
    stream, _ = encode_corpus(gguf_path)
    length = 128 if args.rows else args.tokens
    count = max(args.rows, 2 * args.repeats + 1)
    windows = make_windows(stream, count, length)
    spec = {"prompts": [windows.take(length) for _ in range(count)], "repeats": args.repeats, "rows": args.rows,
            "threads": args.threads, "gguf_path": gguf_path}
    spec_path = Path(f"/tmp/prefill_anatomy_spec_{id(spec)}.json")
    spec_path.write_text(json.dumps(spec))
    peak = measure_peaks(args.threads, quick=False).matmul_fp32_gflops
    results = []
    for engine in [e.strip() for e in args.engines.split(",") if e.strip()]:
        out = subprocess.run([sys.executable, __file__, "--child", engine, "--spec", str(spec_path)],
                             env=child_env(args.threads), capture_output=True, text=True)
        if out.returncode:
            print(f"{engine}: failed: {out.stderr[-1500:]}")
            continue
        results.append(json.loads(out.stdout.strip().splitlines()[-1]))
    rows = args.rows or args.tokens
    print(f"{'decode step of ' + str(args.rows) + ' rows' if args.rows else str(args.tokens) + '-token prefill'}; "
          f"fp32 matmul peak here {peak:.0f} GFLOP/s; {args.threads} threads")
    for r in results:
        wall = statistics.median(r["walls"])
        cats = r["categories"]
        rate = linear_flops(rows) / cats["linears"] / 1e9 if cats["linears"] else float("nan")
        shares = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in cats.items())
        print(f"{r['engine']:<22} median {wall * 1e3:7.1f} ms (min {min(r['walls']) * 1e3:.1f}); profiled: {shares}; "
              f"linears at {rate:.0f} GFLOP/s ({rate / peak:.0%} of peak)")
        print("    top ops: " + "; ".join(f"{k} {s * 1e3:.1f} ms" for k, s in r["top"][:8]))
    if args.json:
        args.json.write_text(json.dumps({"peak_gflops": peak, "args": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
