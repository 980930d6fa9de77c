"""Speculative decoding (n-gram prompt lookup) against plain decoding: decode tokens/s, acceptance, rollback bytes.

    PYTHONPATH=src .venv/bin/python benchmarks/spec_decode.py [--rounds 5] [--models llama,hybrid] [--json out.json]

Workloads: "repetitive" (8 chat-templated copy tasks: repeat, fix a typo, add type hints, reformat a
list, where the answer repeats what the prompt holds; each stops at its natural end or 48 tokens) and
"random" (8 prompts of 64 random token ids, 48 tokens each; lookups hit only where the model's own
continuation loops). --batch 8 submits the 8 prompts together, --batch 1 one at a time.
Configurations: off, ngram with snapshot rollback, ngram with ReplaySSM (K = 3 drafts, window 4). Every
configuration's engine is built once; each round runs every (configuration, workload) once, in a fresh
random order. Decode tokens/s counts the tokens generated after each sequence's first, over the time from
the step after the last prefill to the end. Reported: median [95% CI] over rounds, the per-round ratio to
off (>1 faster), the acceptance rate (accepted / drafted) and tokens per verification.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from infragent.analysis.stats import bootstrap_median
from infragent.engine.config import EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams

CONFIGS = {"off": {}, "ngram snapshot": {"speculative": "ngram", "rollback": "snapshot"},
           "ngram replayssm": {"speculative": "ngram", "rollback": "replayssm"}}
COPY_TASKS = ["Repeat this sentence three times: The quick brown fox jumps over the lazy dog.",
              "Add type hints to this function and return the whole code:\ndef add(a, b):\n    total = a + b\n"
              "    return total",
              "Fix the typo and copy the rest unchanged: The meeting is scheduled for Monday at 10 am in the main "
              "confrence room.",
              "Convert to uppercase: hello world, this is a test of the system.",
              "Repeat after me: All work and no play makes Jack a dull boy.",
              "Rewrite this list as a numbered list: apples, oranges, bananas, grapes, pears",
              "Copy this HTML exactly: <ul><li>Home</li><li>About</li><li>Contact</li></ul>",
              "Translate this Python loop to use a while loop:\nfor i in range(10):\n    print(i)"]
NEW_TOKENS = 48


def workloads(engine: LLMEngine, rng: random.Random) -> dict[str, tuple[list[list[int]], SamplingParams]]:
    """Eight prompts per workload and their sampling (random prompts drawn afresh each call)."""
    tok = engine.tokenizer
    copy = [tok.encode(tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True))
            for t in COPY_TASKS]
    return {"repetitive": (copy, SamplingParams(max_tokens=NEW_TOKENS)),
            "random": ([[rng.randrange(1000, 40000) for _ in range(64)] for _ in COPY_TASKS],
                       SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True))}


def decode_run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams, batch: int) -> dict:
    """Decode tokens/s and the speculation counters of greedy requests, batch at a time."""
    before = dict(engine.runner.speculative_stats)
    elapsed, tokens = 0.0, 0
    for i in range(0, len(prompts), batch):
        seqs = [engine.add_request(p, params) for p in prompts[i:i + batch]]
        while any(not s.output_token_ids and s.finish_reason is None for s in seqs):
            engine.step()
        start, first = time.perf_counter(), sum(len(s.output_token_ids) for s in seqs)
        while engine.has_unfinished():
            engine.step()
        elapsed += time.perf_counter() - start
        tokens += sum(len(s.output_token_ids) for s in seqs) - first
    delta = {k: engine.runner.speculative_stats[k] - before[k] for k in before}
    return {"tok_s": tokens / elapsed, "tokens": tokens, **delta}


def main() -> None:
    """Build, warm, interleave rounds; print per model the table and the rollback bytes."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", default="llama,hybrid")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = {}
    for model in args.models.split(","):
        engines = {name: LLMEngine(EngineConfig(model=model, kv_cache_gb=0.2, max_model_len=512,
                                                enable_prefix_caching=False, **knobs))
                   for name, knobs in CONFIGS.items()}
        rng = random.Random(0)
        for engine in engines.values():
            prompts, params = workloads(engine, rng)["repetitive"]
            decode_run(engine, prompts[:2], params, args.batch)  # warm-up
        samples = {(c, w): [] for c in engines for w in ("repetitive", "random")}
        cells = list(samples)
        for r in range(args.rounds):
            random.Random(r).shuffle(cells)
            for config, workload in cells:
                engine = engines[config]
                prompts, params = workloads(engine, rng)[workload]
                samples[(config, workload)].append(decode_run(engine, prompts, params, args.batch))
        print(f"\n{model}: decode tok/s, 8 greedy requests of up to {NEW_TOKENS} tokens, {args.batch} at a time, "
              f"{args.rounds} interleaved rounds, median [95% CI]; K = 3 drafts")
        print(f"{'workload':<11} {'config':<16} {'tok/s':>20} {'vs off':>20} {'accepted/drafted':>17} "
              f"{'tokens/verification':>20}")
        for workload in ("repetitive", "random"):
            base = [s["tok_s"] for s in samples[("off", workload)]]
            for config in engines:
                runs = samples[(config, workload)]
                tok = bootstrap_median([s["tok_s"] for s in runs])
                ratio = bootstrap_median(list(np.asarray([s["tok_s"] for s in runs]) / np.asarray(base)))
                drafted, accepted = sum(s["drafted"] for s in runs), sum(s["accepted"] for s in runs)
                verifications = sum(s["verifications"] for s in runs)
                rate = f"{accepted / drafted:.3f}" if drafted else "-"
                per = f"{(accepted + verifications) / verifications:.2f}" if verifications else "-"
                print(f"{workload:<11} {config:<16} {tok.fmt(1):>20} {ratio.fmt(3):>20} {rate:>17} {per:>20}")
        rollback = {name: e.kda_states.rollback.state_bytes_per_seq()
                    for name, e in engines.items() if e.kda_states is not None and e.kda_states.rollback}
        if rollback:
            print("KDA rollback state per sequence at window 4: " + ", ".join(f"{k} {v:,} B" for k, v in rollback.items())
                  + f" (replayssm / snapshot = {rollback['ngram replayssm'] / rollback['ngram snapshot']:.4f})")
        results[model] = {"samples": {f"{c}|{w}": v for (c, w), v in samples.items()}, "rollback_bytes": rollback}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main()
