"""Pipeline parallelism (layer split): stages in their own processes, micro-batches flowing through them,
the same tokens as one process on both models; sampling and prompt log-probabilities cross the stages."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig, HybridConfig
from infragent.engine.llm import LLM
from infragent.engine.parallel.pp_runner import _split
from infragent.engine.sampling import SamplingParams
from infragent.engine.scheduler import ScheduledBatch
from test_tensor_parallel import PROMPTS

GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=6, temperature=0.8, seed=5, ignore_eos=True)


def test_micro_batches_split_consecutive_sequences_by_tokens():
    batch = ScheduledBatch(seqs=list("abcdef"), num_new_tokens=[100, 1, 1, 1, 1, 100])
    parts = _split(batch, 2)
    assert [p.seqs for p in parts] == [list("abc"), list("def")]  # 102 tokens each
    assert sum(len(p.seqs) for p in _split(batch, 4)) == 6 and len(_split(batch, 10)) <= 6


def test_pipeline_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="pipeline_parallel_size: does not combine with tensor_parallel_size"):
        EngineConfig(pipeline_parallel_size=2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match="pp_micro_batches: must be a positive integer"):
        EngineConfig(pp_micro_batches=0)


def _run(model: str, stages: int, micro: int = 2, **knobs):
    llm = LLM(model=model, kv_cache_gb=0.05, max_model_len=256, pipeline_parallel_size=stages,
              pp_micro_batches=micro, **knobs)
    try:
        greedy = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        sampled = [o.token_ids for o in llm.generate(PROMPTS[:4], SAMPLED)]
        logprobs = llm.generate(PROMPTS[:2], SamplingParams(max_tokens=1, prompt_logprobs=True))[0].prompt_logprobs
    finally:
        llm.close()
    return greedy, sampled, logprobs


@pytest.mark.parametrize("micro", [1, 3])
def test_two_stages_give_one_process_tokens_on_the_real_model(micro):
    greedy, sampled, logprobs = _run("llama", 1)
    greedy2, sampled2, logprobs2 = _run("llama", 2, micro)
    assert greedy2 == greedy and sampled2 == sampled
    assert torch.allclose(logprobs2, logprobs, atol=1e-4)


def test_three_stages_on_the_hybrid_model():
    small = HybridConfig(hidden_size=128, intermediate_size=256, num_layers=8, num_heads=4, num_kv_heads=2,
                         head_dim=32, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=32)
    assert _run("hybrid", 3, 2, hybrid=small)[:2] == _run("hybrid", 1, hybrid=small)[:2]
