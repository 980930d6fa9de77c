"""Quantized configurations of the real model side by side: decode and prefill tokens/s, memory, quality.

    PYTHONPATH=src .venv/bin/python benchmarks/quant_configs.py [--rounds 7] [--json out.json] [--no-quality]
        [--only 'gguf,gguf-a8']   (fp32, the reference, always runs)

Every configuration's engine is built once; each round times every configuration once, in a fresh random
order (interleaved, so drifts of the machine hit all alike). Decode: 8 sequences of 32 random prompt tokens
each generate 64 tokens, timed from the step after their prefill to the last token. Prefill: one 512-token
prompt, timed over its steps. Reported: median tokens/s with a bootstrap CI over rounds, and the per-round
ratio to fp32 with its CI (>1 faster). Then bytes (KV per token, projection weights) and the quality gates
against fp32 (perplexity increase, KL, greedy agreement; probes/quality.py). Raw samples go to --json.
"""
from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np
import torch

from infragent.analysis.stats import bootstrap_median
from infragent.engine.config import EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams

CONFIGS = {
    "fp32": {"weight_format": "fp32"},
    "gguf": {"weight_format": "gguf"},
    "gguf-a16": {"weight_format": "gguf-a16"},
    "gguf-a8": {"weight_format": "gguf-a8"},
    "kv bf16": {"kv_cache_dtype": "bf16"},
    "kv fp8": {"kv_cache_dtype": "fp8"},
    "kv int8": {"kv_cache_dtype": "int8"},
    "w8a8": {"quantization": "w8a8"},
    "w8a8 sq0.5": {"quantization": "w8a8", "smoothquant_alpha": 0.5},
    "int8-weight": {"quantization": "int8-weight"},
    "w8a8 sq0.5 + kv int8": {"quantization": "w8a8", "smoothquant_alpha": 0.5, "kv_cache_dtype": "int8"},
}
DECODE_SEQS, DECODE_PROMPT, DECODE_TOKENS, PREFILL_TOKENS = 8, 32, 64, 512


def build(knobs: dict) -> LLMEngine:
    """An engine of the real model with these knobs (prefix caching off: rounds reuse nothing)."""
    return LLMEngine(EngineConfig(model="llama", kv_cache_gb=0.3, max_model_len=1024, enable_prefix_caching=False,
                                  **knobs))


def random_prompt(rng: random.Random, length: int) -> list[int]:
    """Ordinary token ids of SmolLM2's vocabulary."""
    return [rng.randrange(1000, 40000) for _ in range(length)]


def decode_tok_s(engine: LLMEngine, rng: random.Random) -> float:
    """Tokens/s of the decode steps of DECODE_SEQS sequences generating DECODE_TOKENS each."""
    params = SamplingParams(max_tokens=DECODE_TOKENS + 1, ignore_eos=True)
    seqs = [engine.add_request(random_prompt(rng, DECODE_PROMPT), params) for _ in range(DECODE_SEQS)]
    while any(not s.output_token_ids for s in seqs):
        engine.step()
    start, generated = time.perf_counter(), sum(len(s.output_token_ids) for s in seqs)
    while engine.has_unfinished():
        engine.step()
    return (sum(len(s.output_token_ids) for s in seqs) - generated) / (time.perf_counter() - start)


def prefill_tok_s(engine: LLMEngine, rng: random.Random) -> float:
    """Tokens/s of one PREFILL_TOKENS-token prompt's prefill."""
    engine.add_request(random_prompt(rng, PREFILL_TOKENS), SamplingParams(max_tokens=1))
    start = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return PREFILL_TOKENS / (time.perf_counter() - start)


def main() -> None:
    """Build, warm, interleave rounds, print the speed table, bytes and quality."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default=None)
    parser.add_argument("--no-quality", action="store_true")
    parser.add_argument("--only", default=None, help="comma-separated config names (fp32 always runs)")
    args = parser.parse_args()
    chosen = ["fp32", *args.only.split(",")] if args.only else list(CONFIGS)
    unknown = [name for name in chosen if name not in CONFIGS]
    if unknown:
        parser.error(f"--only: unknown config(s) {', '.join(unknown)}; choose from {', '.join(CONFIGS)}")
    engines = {name: build(CONFIGS[name]) for name in dict.fromkeys(chosen)}
    rng = random.Random(0)
    for engine in engines.values():  # warm-up: first-touch pages, allocator
        decode_tok_s(engine, rng), prefill_tok_s(engine, rng)
    samples: dict[str, dict[str, list[float]]] = {name: {"decode": [], "prefill": []} for name in engines}
    order = list(engines)
    for r in range(args.rounds):
        random.Random(r).shuffle(order)
        for name in order:
            samples[name]["decode"].append(decode_tok_s(engines[name], rng))
            samples[name]["prefill"].append(prefill_tok_s(engines[name], rng))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {args.rounds} interleaved rounds; "
          f"median [95% CI]; ratio = per-round tok/s over fp32's, >1 faster")
    print(f"{'config':<22} {'decode tok/s':>22} {'vs fp32':>22} {'prefill tok/s':>22} {'vs fp32':>22}")
    for name in engines:
        cells = []
        for phase in ("decode", "prefill"):
            tok = bootstrap_median(samples[name][phase])
            ratio = bootstrap_median(list(np.asarray(samples[name][phase]) / np.asarray(samples["fp32"][phase])))
            cells += [tok.fmt(1), ratio.fmt(3)]
        print(f"{name:<22} " + " ".join(f"{c:>22}" for c in cells))
    fp32 = engines["fp32"]
    print(f"\n{'config':<22} {'KV B/token':>12} {'vs fp32':>8} {'proj. weights MB':>17} {'vs fp32':>8}")
    memory = {}
    for name, engine in engines.items():
        kv, weights = engine.kv_cache.nbytes_per_token(), engine.model.projection_bytes()
        memory[name] = {"kv_bytes_per_token": kv, "projection_bytes": weights}
        print(f"{name:<22} {kv:>12.1f} {kv / fp32.kv_cache.nbytes_per_token():>8.4f} {weights / 1e6:>17.1f} "
              f"{weights / fp32.model.projection_bytes():>8.4f}")
    quality = {}
    if not args.no_quality:
        from infragent.probes.quality import quality as run_quality

        print("\nquality vs fp32 (32 windows of 256 tokens, 64 prompts x 16 greedy tokens):")
        reference = build(CONFIGS["fp32"])
        for name, engine in engines.items():
            if name == "fp32":
                continue
            feedback = run_quality(reference, engine, label=name)
            quality[name] = {k: vars(m) for k, m in feedback.numbers.items()}
            n = feedback.numbers
            print(f"  {name:<22} perplexity {n['perplexity_candidate'].value:.3f} vs {n['perplexity_reference'].value:.3f}"
                  f" increase {n['perplexity_increase'].text()}; KL {n['kl_divergence'].text()};"
                  f" greedy agreement {n['greedy_agreement'].text()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"configs": {name: CONFIGS[name] for name in engines}, "samples": samples, "memory": memory, "quality": quality}, f)


if __name__ == "__main__":
    main()
