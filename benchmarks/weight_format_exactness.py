"""weight_format gguf (or another, --format) against fp32 on the real model: the same greedy tokens, the same logits.

    .venv/bin/python benchmarks/weight_format_exactness.py [--format gguf|gguf-a16|gguf-a8] [--prompts 64]
        [--tokens 64] [--json out.json]

Both engines (weights dequantized to fp32 at load, and the file's Q4_1/Q8_0 blocks kept and computed with fp32
activations) generate greedily from the same prompts (windows of the benchmark corpus). Then each scores the
fp32 engine's whole sequence (prompt + its greedy tokens) in one prefill, returning every position's
log-probabilities (logits less a per-position constant), and the two are compared position by position.

Printed: the prompts whose greedy tokens differ and where; every position where fp32's top two logits lie
within 1e-4 of each other (a near-tie, where summation order may flip the argmax), with whether a divergence
fell there; and the largest relative logit error (max |a - b| / max |b| per position), for the decode steps
(each token's top-20 log-probabilities) and for the scoring prefills (the whole sequence's rows at once), both
through the native kernels where they build. The must-show: no divergence outside a near-tie, errors <= 1e-4.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path


HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_prompts import encode_corpus, make_windows  # noqa: E402

NEAR_TIE = 1e-4
TOP = 20  # log-probabilities compared per generated token


def decode_error(ours: list, theirs: list) -> float:
    """Largest |a - b| / max |b| over the top log-probabilities of each generated token, while both engines
    chose the same tokens (log-probabilities are logits less one constant per step)."""
    worst = 0.0
    for a, b in zip(ours, theirs):
        if a.token != b.token:
            break
        mine = dict(a.top)
        scale = max(abs(v) for _, v in b.top)
        worst = max(worst, max(abs(mine[t] - v) for t, v in b.top if t in mine) / scale)
    return worst


def main() -> None:
    """Run both engines and print the comparison."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--format", default="gguf", help="the weight_format compared with fp32")
    args = parser.parse_args()
    from infragent.engine.gguf_weights import default_gguf_path
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    stream, _ = encode_corpus(str(default_gguf_path()))
    windows = make_windows(stream, args.prompts, args.prompt_len)
    prompts = [windows.take(args.prompt_len) for _ in range(args.prompts)]
    greedy = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True, logprobs=TOP)
    score = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, prompt_logprobs=True)
    engines = {fmt: LLM(model="llama", weight_format=fmt, max_num_seqs=16, max_num_batched_tokens=512)
               for fmt in ("fp32", args.format)}
    started = time.perf_counter()
    outputs = {fmt: llm.generate(prompts, greedy) for fmt, llm in engines.items()}
    tokens = {fmt: [o.token_ids for o in outs] for fmt, outs in outputs.items()}
    decode_worst = max(decode_error(a.logprobs, b.logprobs) for a, b in zip(outputs[args.format], outputs["fp32"]))
    divergences, near_ties, worst = [], [], 0.0
    for i, prompt in enumerate(prompts):
        sequence = list(prompt) + tokens["fp32"][i]
        scored = {fmt: llm.generate([sequence], score)[0].prompt_logprobs for fmt, llm in engines.items()}
        a, b = scored[args.format], scored["fp32"]
        worst = max(worst, ((a - b).abs().amax(dim=1) / b.abs().amax(dim=1)).max().item())
        first = len(prompt) - 1  # the row that predicts the first generated token
        top2 = b[first:].topk(2, dim=1).values
        for step, gap in enumerate((top2[:, 0] - top2[:, 1]).tolist()[:args.tokens]):
            if gap < NEAR_TIE:
                near_ties.append({"prompt": i, "token": step, "gap": gap})
        ours, theirs = tokens[args.format][i], tokens["fp32"][i]
        where = next((t for t, (x, y) in enumerate(zip(ours, theirs)) if x != y), None)
        if where is not None:
            tie = any(n["prompt"] == i and n["token"] == where for n in near_ties)
            divergences.append({"prompt": i, "token": where, "at_near_tie": tie})
    for llm in engines.values():
        llm.close()
    outside = [d for d in divergences if not d["at_near_tie"]]
    print(f"{args.prompts} prompts x {args.tokens} greedy tokens, {args.format} against fp32 ({time.perf_counter() - started:.0f} s)")
    print(f"prompts whose greedy tokens differ: {len(divergences)} ({len(outside)} outside a near-tie)")
    for d in divergences:
        print(f"  prompt {d['prompt']}: first differs at token {d['token']}"
              f"{' (a near-tie)' if d['at_near_tie'] else ' (NOT a near-tie)'}")
    print(f"near-ties in fp32 (top two logits within {NEAR_TIE:g}): {len(near_ties)}")
    for n in near_ties:
        print(f"  prompt {n['prompt']} token {n['token']}: gap {n['gap']:.2e}")
    print(f"max relative logit error, decode steps (the native kernels, batches of up to 16 rows; top {TOP} of "
          f"each step until the tokens part): {decode_worst:.2e} (limit 1e-4): {'PASS' if decode_worst <= 1e-4 else 'FAIL'}")
    print(f"max relative logit error, scoring prefills ({args.prompt_len + args.tokens} rows at once): {worst:.2e} (limit 1e-4): {'PASS' if worst <= 1e-4 else 'FAIL'}")
    print(f"greedy tokens: {'PASS' if not outside else 'FAIL'} (no divergence outside a near-tie)")
    if args.json:
        args.json.write_text(json.dumps({"format": args.format, "divergences": divergences, "near_ties": near_ties,
                                         "max_rel_logit_error_prefill": worst,
                                         "max_rel_logit_error_decode": decode_worst, "prompts": args.prompts,
                                         "tokens": args.tokens}, indent=1))


if __name__ == "__main__":
    main()
