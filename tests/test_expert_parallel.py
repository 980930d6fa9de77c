"""Expert parallelism over gloo: experts split across ranks, tokens dispatched to them and combined back;
EP=2 (alone, and on the same ranks as TP=2) gives EP=1's greedy tokens and log-probabilities."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.models.hybrid import init_hybrid
from infragent.engine.parallel.expert import drop_foreign_experts, expert_bounds
from infragent.engine.sampling import SamplingParams
from infragent.trace import Recorder
from test_tensor_parallel import PROMPTS

SMALL = HybridConfig(hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
                     kda_num_heads=2, kda_head_k_dim=16, kda_head_v_dim=16, moe_intermediate_size=32,
                     shared_expert_intermediate_size=32)
GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


def _run(**knobs) -> tuple[list[list[int]], list[torch.Tensor], dict, set]:
    """Greedy tokens of 16 prompts, prompt log-probabilities of 6, the expert load, and the transports rank 0's
    dispatch spans name."""
    llm = LLM(model="hybrid-moe", hybrid=SMALL, kv_cache_gb=0.02, max_model_len=128, **knobs)
    try:
        with Recorder() as rec:
            tokens = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        tokens.append(llm.generate(PROMPTS[0], GREEDY)[0].token_ids)  # one token a step: a rank with none
        logprobs = [o.prompt_logprobs for o in llm.generate(PROMPTS[:6], SamplingParams(max_tokens=1,
                                                                                        prompt_logprobs=True))]
        load = llm.engine.model.expert_load()
    finally:
        llm.close()
    return tokens, logprobs, load, {s.attrs.get("transport") for s in rec.trace().named("moe.dispatch")}


def _max_abs(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def test_each_rank_keeps_its_share_of_the_experts():
    shape, weights = init_hybrid(SMALL, 1000, moe=True)
    assert [expert_bounds(8, 2, r) for r in range(2)] == [(0, 4), (4, 8)]
    local = drop_foreign_experts(shape, weights, 1, 2)
    assert local.local_experts == (4, 8)
    kept = {int(n.split(".mlp.experts.")[1].split(".")[0]) for n in weights if ".mlp.experts." in n}
    assert kept == {4, 5, 6, 7}
    assert "model.layers.1.mlp.gate.weight" in weights and "model.layers.1.mlp.shared_expert.up_proj.weight" in weights


def test_ep2_alone_and_with_tp2_and_over_each_transport_equal_ep1():
    tokens1, logprobs1, load1, transports = _run()
    assert transports == {None}  # one process: no exchange
    for knobs in (dict(expert_parallel_size=2), dict(expert_parallel_size=2, tensor_parallel_size=2),
                  dict(expert_parallel_size=2, moe_exchange="native"),
                  dict(expert_parallel_size=2, moe_exchange="native-gil-held")):
        tokens2, logprobs2, load2, transports = _run(**knobs)
        assert transports == {knobs.get("moe_exchange", "gloo")}, knobs
        assert tokens2 == tokens1, knobs  # 16 prompts x 32 greedy tokens, then one prompt alone
        assert _max_abs(logprobs2, logprobs1) <= 1e-4, knobs
        assert load2 == load1, knobs  # rank 0 counts every rank's tokens, as one process does


@pytest.mark.parametrize("knobs, message", [
    (dict(expert_parallel_size=3), r"expert_parallel_size: 3 does not divide hybrid.num_experts \(8\)"),
    (dict(expert_parallel_size=2, tensor_parallel_size=4), "expert_parallel_size: 2 with tensor_parallel_size 4"),
    (dict(expert_parallel_size=2, pipeline_parallel_size=2), "expert_parallel_size: does not combine with pipeline"),
    (dict(expert_parallel_size=2, speculative="ngram"), "expert_parallel_size: 2 does not combine with speculative"),
    (dict(expert_parallel_size=0), "expert_parallel_size: must be a positive integer"),
    (dict(moe_exchange="nccl"), "moe_exchange: 'nccl'; choose one of gloo, native, native-gil-held"),
])
def test_bad_expert_parallel_configs_name_the_field(knobs, message):
    with pytest.raises(ConfigError, match=message):
        EngineConfig(model="hybrid-moe", **knobs)


def test_expert_parallelism_needs_experts():
    with pytest.raises(ConfigError, match="expert_parallel_size: 2 needs model hybrid-moe"):
        EngineConfig(model="hybrid", expert_parallel_size=2)


def test_analyze_reports_rank_balance_and_the_exchange_share_of_prefill():
    from infragent.analysis.trace_load import columns_from_trace
    from infragent.probes.analyze import analyze

    llm = LLM(model="hybrid-moe", hybrid=SMALL, kv_cache_gb=0.02, max_model_len=128, expert_parallel_size=2)
    try:
        with Recorder() as rec:
            llm.generate(PROMPTS[:4], SamplingParams(max_tokens=1, ignore_eos=True))
        tokens = sum(len(llm.engine.tokenizer.encode(p)) for p in PROMPTS[:4])
    finally:
        llm.close()
    experts = rec.trace().named("moe.experts")
    rows = [sum(s.attrs["rows_per_rank"][r] for s in experts) for r in range(2)]
    assert sum(rows) == tokens * 2 * 3  # every prompt token, top-2, in each of the 3 MoE layers
    feedback = analyze(columns_from_trace(rec.trace()))
    imbalance = max(rows) / (sum(rows) / 2)
    assert feedback.numbers["moe_rank_imbalance"].value == pytest.approx(imbalance, abs=1e-3)
    share = feedback.numbers["moe_exchange_share_of_prefill"].value
    assert 0 < share < 100
    assert f"rows per expert-parallel rank {rows}" in feedback.finding
