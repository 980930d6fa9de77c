"""The hybrid KDA/attention model through the engine agrees with a naive full-recompute forward."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import pytest
import torch

from infragent.engine.config import HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.models.hybrid import init_hybrid
from infragent.engine.sampling import SamplingParams
from reference_forward import reference_logits

SMALL = HybridConfig(hidden_size=128, intermediate_size=256, num_layers=8, num_heads=4, num_kv_heads=2,
                     head_dim=32, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=48, seed=3, kda_chunk_size=8)
PROMPTS = [list(range(5, 5 + n)) for n in (3, 11, 26, 40)]


@contextmanager
def recorded_logits(llm: LLM) -> Iterator[list[torch.Tensor]]:
    """Record every logits tensor the engine computes while the block runs."""
    seen: list[torch.Tensor] = []
    model = llm.engine.model
    original = model.logits
    model.logits = lambda hidden: seen.append(original(hidden)) or seen[-1]  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del model.logits


def run(llm: LLM, prompts, max_tokens: int = 6):
    return llm.generate(prompts, SamplingParams(max_tokens=max_tokens, ignore_eos=True))


@pytest.fixture(scope="module")
def llm() -> LLM:
    return LLM(model="hybrid", hybrid=SMALL, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=256)


def test_layer_ratio_is_three_kda_to_one_attention():
    assert SMALL.layer_kinds() == ["kda", "kda", "kda", "attention"] * 2


def test_engine_logits_match_reference_within_1e_4(llm):
    """Chunked prefill (budget 16), batched decode: every sampled position's logits vs from-scratch logits."""
    weights = init_hybrid(SMALL, llm.engine.shape.vocab_size)[1]
    for prompt in PROMPTS:
        with recorded_logits(llm) as seen:
            [out] = run(llm, [prompt])
        ref = reference_logits(llm.engine.shape, weights, prompt + out.token_ids)
        engine = torch.cat(seen)  # one row per step: the prompt's last position, then each decode
        expected = ref[len(prompt) - 1:-1]
        assert engine.shape == expected.shape
        assert (engine - expected).abs().max().item() < 1e-4


def test_batched_equals_one_at_a_time(llm):
    together = [o.token_ids for o in run(llm, PROMPTS, 8)]
    alone = [run(llm, [p], 8)[0].token_ids for p in PROMPTS]
    assert together == alone


def test_paged_and_contiguous_kv_give_identical_results():
    kwargs = dict(model="hybrid", hybrid=SMALL, max_num_batched_tokens=16, max_num_seqs=4, max_model_len=128)
    paged = LLM(kv_layout="paged", block_size=4, **kwargs)
    contiguous = LLM(kv_layout="contiguous", **kwargs)
    with recorded_logits(paged) as paged_logits, recorded_logits(contiguous) as contiguous_logits:
        a = [o.token_ids for o in run(paged, PROMPTS, 8)]
        b = [o.token_ids for o in run(contiguous, PROMPTS, 8)]
    assert a == b
    # Paged decode reads whole (masked) blocks, contiguous reads the exact length: same math,
    # reductions of different padded lengths, so logits agree to float rounding.
    assert (torch.cat(paged_logits) - torch.cat(contiguous_logits)).abs().max().item() < 1e-5


def test_same_seed_same_model_different_seed_different_model():
    spec_a = HybridConfig(**{**SMALL.__dict__, "seed": 1})
    spec_b = HybridConfig(**{**SMALL.__dict__, "seed": 2})
    wa, wa2, wb = init_hybrid(spec_a, 100)[1], init_hybrid(spec_a, 100)[1], init_hybrid(spec_b, 100)[1]
    name = "model.layers.0.kda.q_proj.weight"
    assert torch.equal(wa[name], wa2[name]) and not torch.equal(wa[name], wb[name])


def test_preemption_resets_kda_state_and_recomputes_the_same_tokens():
    # 6 blocks of 8 tokens for 3 sequences that each grow past 16 tokens: someone must be preempted,
    # and its KDA state slot is handed back and zeroed before the recompute.
    per_token = 2 * 2 * SMALL.num_kv_heads * SMALL.head_dim * 4  # two attention layers
    tight = LLM(model="hybrid", hybrid=SMALL, kv_cache_gb=6 * 8 * per_token / 1e9, block_size=8,
                max_model_len=48, max_num_seqs=3)
    roomy = LLM(model="hybrid", hybrid=SMALL, max_model_len=48, max_num_seqs=3)
    prompts = [list(range(5, 5 + n)) for n in (9, 12, 14)]
    squeezed = run(tight, prompts, 10)
    assert sum(o.num_preemptions for o in squeezed) > 0
    assert [o.token_ids for o in squeezed] == [o.token_ids for o in run(roomy, prompts, 10)]


def test_a_reused_state_slot_starts_from_zero():
    # A one-token prompt takes the decode path from its first token, so it reads its slot's state:
    # that slot must be zeroed after the previous owner left it dirty.
    used = LLM(model="hybrid", hybrid=SMALL, max_num_seqs=1, max_model_len=64)
    run(used, [PROMPTS[-1]], 4)
    fresh = LLM(model="hybrid", hybrid=SMALL, max_num_seqs=1, max_model_len=64)
    assert run(used, [[7]], 6)[0].token_ids == run(fresh, [[7]], 6)[0].token_ids
