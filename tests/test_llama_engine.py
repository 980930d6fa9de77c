"""The real SmolLM2-135M through the engine: greedy equals naive recompute; bad input is contained."""
from __future__ import annotations

import pytest

from infragent.engine.config import ConfigError
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams
from reference_forward import reference_logits

TEXTS = [
    "Hi",
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "Name three primary colors and explain why they are called primary:",
    "Water boils at 100 degrees Celsius. At what temperature does it freeze? " * 3,
    "In 1969, astronauts first landed on the Moon. The mission was called",
    "The quick brown fox jumps over the lazy dog. " * 12,
]
GREEDY = SamplingParams(max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module")
def llm() -> LLM:
    # A small token budget forces long prompts through chunked prefill across several steps.
    return LLM(model="llama", max_num_batched_tokens=64, max_num_seqs=8, block_size=16)


def assert_greedy_matches_reference(llama_weights, prompt_ids: list[int], output_ids: list[int]) -> None:
    """Engine tokens must be the argmax of from-scratch logits at every generated position."""
    spec, weights = llama_weights
    logits = reference_logits(spec, weights, prompt_ids + output_ids)
    expected = logits[len(prompt_ids) - 1:-1].argmax(-1).tolist()
    assert output_ids == expected


def test_prompts_have_mixed_lengths(llm):
    lengths = sorted(len(llm.tokenizer.encode(t)) for t in TEXTS)
    assert lengths[0] <= 2 and lengths[-1] > 100 and len(set(lengths)) == len(TEXTS)


def test_batched_greedy_equals_naive_recompute(llm, llama_weights):
    outputs = llm.generate(TEXTS, GREEDY)
    assert [o.error for o in outputs] == [None] * len(TEXTS)
    for out in outputs:
        assert len(out.token_ids) == 10
        assert out.text == llm.tokenizer.decode(out.token_ids)  # streamed detokenization adds up
        assert_greedy_matches_reference(llama_weights, out.prompt_token_ids, out.token_ids)


def test_one_at_a_time_equals_batched(llm):
    batched = [o.token_ids for o in llm.generate(TEXTS, GREEDY)]
    alone = [llm.generate(t, GREEDY)[0].token_ids for t in TEXTS]
    assert alone == batched


def test_prefix_cache_hit_gives_same_tokens(llm):
    long = TEXTS[-1]
    first = llm.generate(long, GREEDY)[0]
    again = llm.generate(long, GREEDY)[0]
    assert again.num_cached_tokens >= 64 and again.token_ids == first.token_ids


def test_chat_prompt_produces_coherent_english(llm):
    [out] = llm.chat([{"role": "user", "content": "What is the capital of France?"}], SamplingParams(max_tokens=24))
    assert "Paris" in out.text
    assert out.finish_reason in ("stop", "length")


def test_sampling_with_seed_is_reproducible_and_varies(llm):
    params = [SamplingParams(max_tokens=12, temperature=1.0, top_p=0.9, top_k=50, seed=s) for s in (1, 1, 2)]
    a, b, c = (o.token_ids for o in llm.generate(["Tell me a story."] * 3, params))
    assert a == b and a != c


def test_stop_string_cuts_output(llm):
    [out] = llm.generate("1, 2, 3, 4, 5,", SamplingParams(max_tokens=20, stop=[" 8"]))
    assert out.finish_reason == "stop" and " 8" not in out.text and out.text.startswith(" 6")


def test_bad_requests_get_field_errors_and_leave_others_alone(llm):
    good = TEXTS[1]
    too_long = "word " * (llm.engine.max_model_len + 10)
    prompts = [good, too_long, good, good, good]
    params = [GREEDY, GREEDY, SamplingParams(max_tokens=0), SamplingParams(top_p=1.5, max_tokens=3),
              SamplingParams(top_p=0.0, max_tokens=3)]
    outputs = llm.generate(prompts, params)
    assert outputs[0].error is None
    assert "prompt" in outputs[1].error and "max_model_len" in outputs[1].error
    assert outputs[2].error.startswith("max_tokens")
    assert outputs[3].error.startswith("top_p") and outputs[4].error.startswith("top_p")
    assert outputs[0].token_ids == llm.generate(good, GREEDY)[0].token_ids


def test_unknown_model_names_the_field():
    with pytest.raises(ConfigError, match="model: unknown model 'gpt5'"):
        LLM(model="gpt5")


def test_preemption_recomputes_to_the_same_tokens():
    # 8 blocks × 16 tokens: the first three prompts fill the cache, and decoding past a block edge preempts.
    llm = LLM(model="llama", kv_cache_gb=8 * 16 * 46080 / 1e9, max_model_len=128, max_num_seqs=4)
    prompts = [TEXTS[3], TEXTS[5], TEXTS[6], TEXTS[3] + " a"]
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    assert sum(o.num_preemptions for o in outputs) > 0
    llm.close()
    del llm  # its weights go before the second engine's come
    roomy = LLM(model="llama", max_num_seqs=4, max_model_len=128, kv_cache_gb=0.05)  # room for all four at once
    assert [o.token_ids for o in outputs] == [o.token_ids for o in roomy.generate(prompts, params)]
