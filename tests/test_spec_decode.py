"""Speculative decoding: n-gram drafts, greedy verification, KV truncation and KDA rollback (snapshot and
ReplaySSM) leave greedy outputs unchanged; ReplaySSM's rollback state is a fraction of the snapshots'."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.models.kda_ops import (kda_decode_reference, kda_decode_step, kda_recurrent, kda_replay,
                                             kda_steps)
from infragent.engine.sampling import SamplingParams
from infragent.engine.speculative.ngram import propose_ngram
from infragent.engine.speculative.verify import accept_greedy

SMALL = HybridConfig(hidden_size=128, intermediate_size=256, num_layers=8, num_heads=4, num_kv_heads=2,
                     head_dim=32, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=32, seed=3)
REPETITIVE = ["The quick brown fox jumps over the lazy dog. " * 5,
              "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
              "one two three four one two three four one two"]
GREEDY = SamplingParams(max_tokens=40, ignore_eos=True)


def test_ngram_proposes_what_followed_the_latest_match():
    assert propose_ngram([1, 2, 3, 4, 1, 2], 3) == [3, 4, 1]
    assert propose_ngram([7, 1, 2, 9, 1, 2, 8, 1, 2], 2) == [8, 1]  # the latest occurrence wins
    assert propose_ngram([1, 2, 3], 3) == [] and propose_ngram([1, 2, 1], 0) == []
    assert propose_ngram([5, 6, 5, 6, 5], 4, n_max=2, n_min=2) == [6, 5]


def test_greedy_acceptance_keeps_the_matching_prefix_and_the_targets_next_token():
    logits = torch.full((4, 10), -1.0)
    for row, best in enumerate([3, 5, 7, 2]):
        logits[row, best] = 1.0
    assert accept_greedy(logits, [3, 5, 7]) == [3, 5, 7, 2]
    assert accept_greedy(logits, [3, 4, 7]) == [3, 5]
    assert accept_greedy(logits, [9, 5, 7]) == [3]


def _kda_case(T: int = 6, H: int = 3, dk: int = 16, dv: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(T, H, dk, generator=g), torch.randn(T, H, dk, generator=g), torch.randn(T, H, dv, generator=g),
            -torch.rand(T, H, dk, generator=g) * 2, torch.rand(T, H, generator=g), torch.randn(H, dk, dv, generator=g))


def test_replay_in_closed_form_gives_each_prefix_state():
    q, k, v, g, beta, s0 = _kda_case()
    steps = kda_steps(q, k, v, g, beta, s0, record_inputs=True, record_states=True)
    o, final = kda_recurrent(q, k, v, g, beta, s0)
    assert torch.equal(steps.o, o) and torch.equal(steps.state, final)
    for n in range(1, 7):
        replayed = kda_replay(s0, steps.k[:n], steps.u[:n], steps.g[:n])
        assert torch.allclose(replayed, steps.states[n - 1], atol=1e-5), n
    assert torch.equal(kda_replay(s0, steps.k[:0], steps.u[:0], steps.g[:0]), s0)


@pytest.mark.parametrize("bv_tile, head_split", [(None, 1), (16, 1), (24, 2), (None, 4), (8, 4)])
def test_decode_step_tilings_match_the_reference_loop(bv_tile, head_split):
    g0 = torch.Generator().manual_seed(1)
    B, H, dk, dv = 3, 4, 32, 48
    q, k, v = torch.randn(B, H, dk, generator=g0), torch.randn(B, H, dk, generator=g0), torch.randn(B, H, dv, generator=g0)
    g, beta, s0 = -torch.rand(B, H, dk, generator=g0), torch.rand(B, H, generator=g0), torch.randn(B, H, dk, dv, generator=g0)
    ref_state, state = s0.clone(), s0.clone()
    expected = kda_decode_reference(q, k, v, g, beta, ref_state)
    out = kda_decode_step(q, k, v, g, beta, state, bv_tile=bv_tile, head_split=head_split)
    assert torch.allclose(out, expected, atol=1e-5) and torch.allclose(state, ref_state, atol=1e-5)


def test_speculative_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="speculative: 'eagle'"):
        EngineConfig(speculative="eagle")
    with pytest.raises(ConfigError, match="rollback: 'undo'"):
        EngineConfig(rollback="undo")
    with pytest.raises(ConfigError, match="rollback_window: 3 cannot hold"):
        EngineConfig(speculative="ngram", num_speculative_tokens=3, rollback_window=3)
    with pytest.raises(ConfigError, match="kda_head_split: 3 must divide the 8 KDA heads"):
        EngineConfig(kda_head_split=3)


def _generate(model: str, prompts, params, **knobs):
    llm = LLM(model=model, hybrid=SMALL, kv_cache_gb=0.05, max_model_len=512, **knobs)
    outputs = llm.generate(prompts, params)
    engine = llm.engine
    assert engine.blocks.num_free_blocks == engine.blocks.num_blocks  # truncation and finishing leak nothing
    return [o.token_ids for o in outputs], engine.runner.speculative_stats


@pytest.mark.parametrize("rollback", ["snapshot", "replayssm"])
def test_hybrid_greedy_outputs_are_unchanged_by_speculation(rollback):
    # a small token budget makes verifications share steps with chunked prefills and get cut short
    plain, _ = _generate("hybrid", REPETITIVE, GREEDY, max_num_batched_tokens=24)
    spec, stats = _generate("hybrid", REPETITIVE, GREEDY, max_num_batched_tokens=24, speculative="ngram",
                            num_speculative_tokens=3, rollback=rollback, prompt_lookup_min=1)
    assert spec == plain
    assert stats["accepted"] > 0 and stats["drafted"] > stats["accepted"]  # some accepted, some rolled back


def test_replayssm_with_a_longer_ring_folds_and_still_matches():
    plain, _ = _generate("hybrid", REPETITIVE, GREEDY)
    spec, stats = _generate("hybrid", REPETITIVE, GREEDY, speculative="ngram", num_speculative_tokens=2,
                            rollback="replayssm", rollback_window=7, prompt_lookup_min=1)
    assert spec == plain and stats["accepted"] > 0


def test_real_model_greedy_outputs_are_unchanged_by_speculation():
    plain, _ = _generate("llama", REPETITIVE, GREEDY)
    spec, stats = _generate("llama", REPETITIVE, GREEDY, speculative="ngram", num_speculative_tokens=4)
    assert spec == plain
    assert stats["accepted"] / stats["verifications"] > 0.5  # repetitive text: most steps gain tokens


def test_sampled_requests_are_unaffected_and_preemption_recomputes():
    sampled = SamplingParams(max_tokens=24, temperature=0.8, seed=7, ignore_eos=True)
    plain, _ = _generate("hybrid", REPETITIVE, sampled)
    spec, stats = _generate("hybrid", REPETITIVE, sampled, speculative="ngram")
    assert spec == plain and stats["drafted"] == 0  # drafts are for greedy requests only
    # a cache of about 22 blocks for 6 sequences of up to 6 blocks forces preemption mid-speculation
    tight = dict(kv_cache_gb=0.00036, max_model_len=256, block_size=16, max_num_seqs=6)
    llm = LLM(model="hybrid", hybrid=SMALL, **tight)
    base = [o.token_ids for o in llm.generate(REPETITIVE * 2, GREEDY)]
    llm = LLM(model="hybrid", hybrid=SMALL, **tight, speculative="ngram", rollback="replayssm")
    assert [o.token_ids for o in llm.generate(REPETITIVE * 2, GREEDY)] == base
    assert llm.engine.scheduler.num_preemptions > 0


def test_replayssm_rollback_state_is_under_a_quarter_of_the_snapshots_at_window_4():
    sizes = {}
    for rollback in ("snapshot", "replayssm"):
        llm = LLM(model="hybrid", kv_cache_gb=0.05, max_model_len=512, speculative="ngram",
                  num_speculative_tokens=3, rollback=rollback)
        sizes[rollback] = llm.engine.kda_states.rollback.state_bytes_per_seq()
    cfg = HybridConfig()
    layers = cfg.layer_kinds().count("kda")
    assert sizes["snapshot"] == layers * 4 * cfg.kda_num_heads * cfg.kda_head_k_dim * cfg.kda_head_v_dim * 4
    assert sizes["replayssm"] == layers * 4 * cfg.kda_num_heads * (2 * cfg.kda_head_k_dim + cfg.kda_head_v_dim + 1) * 4
    assert sizes["replayssm"] <= sizes["snapshot"] / 4


def test_draft_model_of_the_first_layers_keeps_outputs_unchanged():
    plain, _ = _generate("hybrid", REPETITIVE, GREEDY)
    spec, stats = _generate("hybrid", REPETITIVE, GREEDY, speculative="draft", draft_layers=2, draft_window=32,
                            rollback="replayssm")
    assert spec == plain and stats["drafted"] > 0 and stats["accepted"] > 0
    with pytest.raises(ConfigError, match="draft_layers: 8 is not fewer"):
        LLM(model="hybrid", hybrid=SMALL, kv_cache_gb=0.05, max_model_len=512, speculative="draft", draft_layers=8)
