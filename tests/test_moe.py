"""The MoE feed-forward layer and the hybrid-moe model: grouped experts against a token-by-token loop, routing
ties, load counters, spans, config errors."""
from __future__ import annotations

import math

import pytest
import torch

from infragent.engine.config import EngineConfig, HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.metrics import ServerMetrics
from infragent.engine.models.layers import GatedMLP
from infragent.engine.models.moe import MoE, Router, reference_moe
from infragent.engine.options import ConfigError
from infragent.engine.sampling import SamplingParams
from infragent.trace import Recorder

TINY = dict(hidden_size=64, intermediate_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
            kda_num_heads=4, kda_head_k_dim=16, kda_head_v_dim=16, moe_intermediate_size=32,
            shared_expert_intermediate_size=32)


def random_moe(hidden: int, experts: int, top_k: int, scoring: str, shared: bool, seed: int = 0) -> MoE:
    gen = torch.Generator().manual_seed(seed)

    def w(out: int, inp: int) -> torch.Tensor:
        return torch.randn(out, inp, generator=gen) / math.sqrt(inp)

    def mlp(inter: int) -> GatedMLP:
        return GatedMLP(w(inter, hidden), w(inter, hidden), w(hidden, inter))

    return MoE(Router(w(experts, hidden), top_k, scoring), [mlp(24 + 8 * (e % 3)) for e in range(experts)],
               mlp(40) if shared else None)


@pytest.mark.parametrize("tokens", [1, 7, 33])
@pytest.mark.parametrize("scoring, top_k, shared", [("softmax", 2, True), ("sigmoid", 3, False), ("softmax", 1, False)])
def test_grouped_experts_match_the_token_loop(tokens, scoring, top_k, shared):
    moe = random_moe(48, 6, top_k, scoring, shared)
    x = torch.randn(tokens, 48, generator=torch.Generator().manual_seed(tokens))
    grouped, reference = moe(x), reference_moe(moe, x)
    assert torch.allclose(grouped, reference, rtol=1e-5, atol=1e-6), (grouped - reference).abs().max()
    assert moe.tokens_per_expert.sum() == tokens * top_k == moe.last_step.sum()


def test_an_expert_nobody_picks_is_skipped_and_rows_stay_in_place():
    moe = random_moe(16, 4, 1, "softmax", False)
    moe.router.gate.weight_t.zero_()
    moe.router.gate.weight_t[0, 2] = 10.0  # a positive first feature sends the token to expert 2
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(3)).abs()
    assert torch.allclose(moe(x), reference_moe(moe, x), rtol=1e-5, atol=1e-6)
    assert moe.last_step.tolist() == [0, 0, 9, 0]


def test_equal_scores_go_to_the_lower_expert_id_whatever_the_batch():
    router = Router(torch.zeros(8, 16), top_k=3, scoring="sigmoid")  # every score equal
    x = torch.randn(5, 16)
    routing = router(x)
    assert routing.expert_ids.tolist() == [[0, 1, 2]] * 5
    assert torch.allclose(routing.weights, torch.full((5, 3), 1 / 3))
    tied = Router(torch.cat([torch.ones(2, 16), torch.zeros(6, 16)]), top_k=1, scoring="softmax")
    ones = torch.ones(4, 16)
    assert tied(ones).expert_ids.tolist() == [[0]] * 4 == tied(ones[:1].repeat(4, 1)).expert_ids.tolist()


def test_router_weights_are_normalized_top_k_scores():
    router = Router(torch.randn(5, 12), top_k=2, scoring="softmax")
    x = torch.randn(6, 12)
    routing = router(x)
    scores = torch.softmax(x @ router.gate.weight_t, dim=-1)
    best = scores.topk(2, dim=-1)
    assert torch.equal(routing.expert_ids, best.indices)
    assert torch.allclose(routing.weights, best.values / best.values.sum(-1, keepdim=True))


def tiny_moe_llm(**knobs: object) -> LLM:
    return LLM(model="hybrid-moe", hybrid=HybridConfig(**TINY), num_threads=1, **knobs)


def test_hybrid_moe_generates_the_same_tokens_alone_and_batched():
    llm = tiny_moe_llm()
    layers = llm.engine.model.layers
    assert [type(mlp).__name__ for *_, mlp in layers] == ["GatedMLP", "MoE", "MoE", "MoE"]
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    prompts = ["The quick brown fox", "A mixture of experts", "One two three four five six"]
    alone = [llm.generate(p, params)[0].token_ids for p in prompts]
    before = {i: sum(totals) for i, (totals, _) in llm.engine.model.expert_load().items()}
    with Recorder() as rec:
        batched = [o.token_ids for o in llm.generate(prompts, params)]
    assert batched == alone
    names = {s.name for s in rec.trace().spans}
    assert {"moe.route", "moe.dispatch", "moe.experts", "moe.combine"} <= names
    # every scheduled token (prompt and generated, minus the last sampled one) is routed to top-k experts
    positions = sum(len(llm.engine.tokenizer.encode(p)) + 8 - 1 for p in prompts)
    for layer, (totals, _) in llm.engine.model.expert_load().items():
        assert sum(totals) - before[layer] == 2 * positions, layer


def test_expert_load_reaches_the_metrics():
    llm = tiny_moe_llm()
    llm.generate(["Hello experts"], SamplingParams(max_tokens=4, temperature=0.0))
    metrics = ServerMetrics()
    load = llm.engine.model.expert_load()
    metrics.set_expert_load(load)
    metrics.set_expert_load(load)  # running totals: a second publish adds nothing
    text = metrics.render().decode()
    total = sum(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("infragent:moe_expert_tokens_total{") and 'layer="1"' in line)
    assert total == sum(load[1][0])
    assert 'infragent:moe_step_imbalance{layer="3"}' in text


@pytest.mark.parametrize("fields, message", [
    (dict(num_experts_per_tok=9), "hybrid.num_experts_per_tok: 9 must be between 1 and num_experts (8)"),
    (dict(num_experts=0), "hybrid.num_experts: 0 must be at least 1"),
    (dict(router_scoring="relu"), "hybrid.router_scoring: 'relu'"),
    (dict(first_dense_layers=9), "hybrid.first_dense_layers: 9"),
])
def test_bad_moe_configs_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        EngineConfig(model="hybrid-moe", hybrid=HybridConfig(**fields))


def test_the_dense_hybrid_ignores_the_moe_fields():
    EngineConfig(model="hybrid", hybrid=HybridConfig(num_experts_per_tok=9))


def test_the_quality_probe_runs_on_the_moe_model_with_its_experts_quantized():
    from infragent.probes.quality import QualityPlan, quality_of

    feedback = quality_of("hybrid-moe", {"quantization": "w8a8"}, QualityPlan(windows=2, window=32, prompts=2))
    assert {"kl_divergence", "greedy_agreement", "perplexity_increase"} <= set(feedback.numbers)
    assert feedback.numbers["kl_divergence"].value > 0  # int8 experts change the numbers: the probe sees them


def test_weight_quantization_reaches_every_expert():
    llm = tiny_moe_llm(weight_format="int8")
    moe = llm.engine.model.layers[1][3]
    for ffn in [*moe.experts, moe.shared]:
        assert type(ffn.gate_up).__name__ == type(ffn.down).__name__ == "BlockLinear"
    assert type(moe.router.gate).__name__ == "Linear"  # routing stays fp32
    assert llm.generate(["Experts"], SamplingParams(max_tokens=3, temperature=0.0))[0].token_ids


def test_a_routing_bias_chooses_the_experts_but_does_not_weight_them():
    weight = torch.randn(6, 16, generator=torch.Generator().manual_seed(5))
    x = torch.randn(9, 16, generator=torch.Generator().manual_seed(6))
    plain = Router(weight, top_k=2, scoring="softmax")
    biased = Router(weight, top_k=2, scoring="softmax", bias=torch.tensor([0.0, 0, 0, 0, 5.0, 5.0]))
    ids = biased(x).expert_ids
    assert ids.sort(dim=1).values.tolist() == [[4, 5]] * 9
    scores = torch.softmax(x @ plain.gate.weight_t, dim=-1).gather(1, ids)  # unbiased scores weight them
    assert torch.allclose(biased(x).weights, scores / scores.sum(-1, keepdim=True))
    assert plain(x).expert_ids.sort(dim=1).values.tolist() != [[4, 5]] * 9


def test_pack_variants_resolve_and_a_missing_one_is_named():
    from infragent.lab.spec import PACKS, SpecError, resolve_spec

    assert resolve_spec("kv-transfer-gil:moe") == PACKS / "kv-transfer-gil" / "moe.toml"
    with pytest.raises(SpecError, match=r"kv-transfer-gil:dense: pack kv-transfer-gil has no variant 'dense' "
                                        r"\(variants: moe\)"):
        resolve_spec("kv-transfer-gil:dense")
