"""Tensor parallelism over gloo: shards split by KV-head group / KDA head / MLP rows / vocabulary, TP=2 gives
TP=1's greedy tokens on the real model, and reduced-precision partial sums drift while the 3-pass split
does not (case study 1)."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.parallel.shard import bounds, shard_weights
from infragent.engine.sampling import SamplingParams

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Three things to pack for a hike:", "Hi",
           "Once upon a time, in a small village,", "Water boils at", "The quick brown fox", "import numpy as np\n",
           "Name three primary colors:", "In 1969, astronauts", "SELECT * FROM", "My favourite book is",
           "The weather today is", "To make a cup of tea,", "2 + 2 =", "Translate to French: cat"]
GREEDY = SamplingParams(max_tokens=12, ignore_eos=True)


def test_bounds_split_evenly_with_earlier_ranks_taking_the_remainder():
    assert [bounds(9, 2, r) for r in range(2)] == [(0, 5), (5, 9)]
    assert [bounds(3, 3, r) for r in range(3)] == [(0, 1), (1, 2), (2, 3)]


def test_smollm2_shards_whole_gqa_groups_unevenly(llama_weights):
    spec, weights = llama_weights
    shards = [shard_weights(spec, weights, rank, 2) for rank in range(2)]
    (s0, w0), (s1, w1) = shards
    assert (s0.num_kv_heads, s0.num_heads, s1.num_kv_heads, s1.num_heads) == (2, 6, 1, 3)
    assert w0["model.layers.0.self_attn.q_proj.weight"].shape == (6 * 64, 576)
    assert w1["model.layers.0.self_attn.o_proj.weight"].shape == (576, 3 * 64)
    assert w0["model.layers.0.mlp.down_proj.weight"].shape == (576, 768)
    assert w0["lm_head.weight"].shape == (24576, 576) and w0["model.embed_tokens.weight"].shape[0] == 49152
    full = weights["model.layers.3.self_attn.k_proj.weight"]
    assert torch.equal(torch.cat([w0["model.layers.3.self_attn.k_proj.weight"],
                                  w1["model.layers.3.self_attn.k_proj.weight"]]), full)


def test_tensor_parallel_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="tp_partial_precision: 'half'"):
        EngineConfig(tp_partial_precision="half")
    with pytest.raises(ConfigError, match="tensor_parallel_size: 2 does not combine with speculative"):
        EngineConfig(tensor_parallel_size=2, speculative="ngram")


def _run(model: str, tp: int, precision: str = "fp32", **knobs):
    llm = LLM(model=model, kv_cache_gb=0.05, max_model_len=256, tensor_parallel_size=tp,
              tp_partial_precision=precision, **knobs)
    try:
        tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        logprobs = [o.prompt_logprobs for o in llm.generate(PROMPTS[:4], SamplingParams(max_tokens=1,
                                                                                        prompt_logprobs=True))]
    finally:
        llm.close()
    return tokens, logprobs


def _max_rel(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float(((x - y).abs() / y.abs().clamp_min(1e-6)).max()) for x, y in zip(a, b))


def test_tp2_equals_tp1_on_the_real_model_and_the_3_pass_split_removes_the_drift():
    tokens1, logprobs1 = _run("llama", 1)
    drift = {}
    for precision in ("fp32", "reduced", "3-pass"):
        tokens2, logprobs2 = _run("llama", 2, precision)
        drift[precision] = _max_rel(logprobs2, logprobs1)
        if precision != "reduced":
            assert tokens2 == tokens1, precision  # 16 prompts, 12 greedy tokens each
    assert drift["fp32"] < 1e-4
    assert drift["reduced"] > 1e-3  # bf16 partial sums: the case study's drift
    assert drift["3-pass"] < 2e-4 and drift["3-pass"] < drift["reduced"] / 50


def test_tp2_equals_tp1_on_the_hybrid_model():
    small = HybridConfig(hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                         head_dim=32, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=32)
    assert _run("hybrid", 2, hybrid=small)[0] == _run("hybrid", 1, hybrid=small)[0]


def test_a_dead_rank_fails_the_next_step_at_once_with_its_name():
    from infragent.engine.parallel.group import RankDiedError

    llm = LLM(model="llama", kv_cache_gb=0.05, max_model_len=256, tensor_parallel_size=2)
    try:
        assert llm.generate(["Hi"], SamplingParams(max_tokens=2))[0].token_ids
        worker = llm.engine.runner.workers[0]
        worker.kill()
        worker.join(timeout=10)
        with pytest.raises(RankDiedError, match=r"tp-rank-1 \(pid \d+\) exited with code -9"):
            llm.generate(["Hello"], SamplingParams(max_tokens=2))  # an error naming the dead rank, not a hang
    finally:
        llm.close()
