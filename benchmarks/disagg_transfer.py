"""Issue 9's acceptance benchmark: a disaggregated prefill worker's throughput with its KV transfer on and
off, on identical workloads, and how much of the transfer overlaps prefill compute in the trace.

    PYTHONPATH=src .venv/bin/python benchmarks/disagg_transfer.py [--rounds 15] [--threads 1] [--store shm]
        [--json out.json]

Each configuration is the real model in a PrefillWorker (the class `serve --disagg` runs), attached to a
shared-memory (or TCP) KV store, prefix caching off; "off" is the same engine with no transfer. Each round
prefills one fresh random 512-token prompt per configuration, in a fresh random order, until the worker
reports "prefilled" (the KV has landed). Reported: median prefill tok/s [95% CI], the paired per-round
regression against off [95% CI] (target for layerwise: at most 5%), and from a Recorder trace of further
prefills the share of transfer time that prefill compute (the "prefill" forward span) overlaps: wall time,
and executing (the transfer thread on CPU while the forward ran). Raw samples go to --json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import time

import numpy as np

from infragent.analysis.overlap import overlap
from infragent.analysis.stats import bootstrap_median
from infragent.analysis.trace_load import columns_from_trace
from infragent.engine.config import EngineConfig
from infragent.engine.disagg.store import SharedStore, StoreLayout
from infragent.engine.disagg.tcp_store import StoreServer, TCPStoreClient
from infragent.engine.disagg.worker import PrefillWorker
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams
from infragent.trace import Recorder

PROMPT_TOKENS = 512
MODES = [("layerwise", "bulk"), ("layerwise", "serialize"), ("after_prefill", "bulk"),
         ("after_prefill", "serialize")]


class Prefiller:
    """One configuration: an engine, and (transfer on) the PrefillWorker around it and its store."""

    def __init__(self, threads: int, store_kind: str, mode: str | None, impl: str | None) -> None:
        config = EngineConfig(model="llama", kv_cache_gb=0.3, max_model_len=1024, num_threads=threads,
                              max_num_batched_tokens=PROMPT_TOKENS, enable_prefix_caching=False,
                              kv_transfer_mode=mode or "layerwise", kv_transfer_impl=impl or "bulk")
        self.engine = LLMEngine(config)
        self.worker = self.store = None
        self.ids = 0
        if mode is None:
            return
        spec, cache = self.engine.shape, self.engine.kv_cache
        layout = StoreLayout(self.engine.blocks.num_blocks, cache.block_size, spec.num_attention_layers,
                             spec.num_kv_heads * spec.head_dim, 4)
        if store_kind == "shm":
            self.store = SharedStore(layout)
            client = SharedStore(layout, name=self.store.address[1])
        else:
            self.store = StoreServer(layout)
            client = TCPStoreClient(*self.store.address[1:])
        self.conn, theirs = multiprocessing.Pipe()
        self.worker = PrefillWorker(self.engine, client, theirs, timeout_s=60)
        self.blocks = list(range(-(-PROMPT_TOKENS // cache.block_size)))

    def prefill_tok_s(self, prompt: list[int]) -> float:
        """Tokens/s of one prompt's prefill, until its first token (and, transfer on, its KV) is ready."""
        params = SamplingParams(max_tokens=1)
        start = time.perf_counter()
        if self.worker is None:
            self.engine.add_request(prompt, params)
            while self.engine.has_unfinished():
                self.engine.step()
        else:
            self.ids += 1
            self.worker.handle(("prefill", f"r{self.ids}", prompt, params, self.blocks, None))
            while self.engine.has_unfinished():
                self.worker.after_step(self.engine.step_updates())
            reply = self.conn.recv()
            assert reply[0] == "prefilled", reply
        return PROMPT_TOKENS / (time.perf_counter() - start)

    def close(self) -> None:
        self.engine.close()
        if self.store is not None:
            self.store.close()


def overlap_shares(prefiller: Prefiller, prompts: list[list[int]]) -> tuple[float, float | None]:
    """Share of kv.transfer time during the prefill forward: wall, and executing."""
    with Recorder(thread_cpu=True) as rec:
        for prompt in prompts:
            prefiller.prefill_tok_s(prompt)
    o = overlap(columns_from_trace(rec.trace()), "kv.transfer", "prefill")
    return o.share_of_a, o.executing_share_of_a


def main() -> None:
    """Interleaved rounds, then traced prefills; print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--store", default="shm", choices=["shm", "tcp"])
    parser.add_argument("--traced", type=int, default=4, help="prefills recorded per configuration for overlap")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    names = ["off"] + [f"{mode} {impl}" for mode, impl in MODES]
    prefillers = {"off": Prefiller(args.threads, args.store, None, None)}
    prefillers.update({f"{mode} {impl}": Prefiller(args.threads, args.store, mode, impl) for mode, impl in MODES})
    rng = random.Random(0)

    def prompt() -> list[int]:
        return [rng.randrange(1000, 40000) for _ in range(PROMPT_TOKENS)]

    for p in prefillers.values():
        p.prefill_tok_s(prompt())  # warm-up
    samples: dict[str, list[float]] = {name: [] for name in names}
    order = list(names)
    for r in range(args.rounds):
        random.Random(r).shuffle(order)
        for name in order:
            samples[name].append(prefillers[name].prefill_tok_s(prompt()))
    shares = {name: overlap_shares(prefillers[name], [prompt() for _ in range(args.traced)]) for name in names[1:]}
    base = np.asarray(samples["off"])
    print(f"store {args.store}, {args.threads} compute thread(s), {PROMPT_TOKENS}-token prefills, {args.rounds} "
          f"interleaved rounds; median [95% CI]")
    print(f"{'transfer':<24} {'prefill tok/s':>22} {'regression vs off':>26} {'overlap wall':>13} {'executing':>10}")
    for name in names:
        tok = bootstrap_median(samples[name])
        regression = bootstrap_median(list(base / np.asarray(samples[name]) - 1))
        wall, executing = shares.get(name, (None, None))
        extra = "" if wall is None else f" {wall:>13.1%} {executing if executing is None else f'{executing:.1%}':>10}"
        print(f"{name:<24} {tok.fmt(1):>22} {regression.fmt(4):>26}{extra}")
    for p in prefillers.values():
        p.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"store": args.store, "threads": args.threads, "samples": samples, "overlap": shares}, f)


if __name__ == "__main__":
    main()
