"""SamplingParams validation and the sampler's greedy / top-k / top-p / seed behaviour."""
from __future__ import annotations

import math

import pytest
import torch

from infragent.engine.sampling import RequestError, SamplingParams, _filter_top_k_top_p, sample


@pytest.mark.parametrize("kwargs, field", [
    ({"max_tokens": 0}, "max_tokens"), ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.01}, "top_p"), ({"top_k": -2}, "top_k"), ({"stop": [""]}, "stop"),
])
def test_invalid_params_name_the_field(kwargs, field):
    with pytest.raises(RequestError, match=f"^{field}"):
        SamplingParams(**kwargs).validate()


def test_top_k_keeps_exactly_k():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    kept = _filter_top_k_top_p(logits, top_k=2, top_p=1.0).isfinite()
    assert kept.tolist() == [False, True, False, True, False]


def test_top_p_keeps_the_smallest_nucleus_reaching_p():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log()
    assert _filter_top_k_top_p(logits, 0, 0.5).isfinite().tolist() == [True, False, False, False]
    assert _filter_top_k_top_p(logits, 0, 0.79).isfinite().tolist() == [True, True, False, False]
    assert _filter_top_k_top_p(logits, 0, 0.9).isfinite().tolist() == [True, True, True, False]


def test_sampling_frequencies_follow_the_filtered_distribution():
    logits = torch.tensor([[math.log(0.6), math.log(0.3), math.log(0.1)]]).repeat(4000, 1)
    params = [SamplingParams(temperature=1.0, top_p=0.85)] * 4000
    gen = torch.Generator().manual_seed(0)
    picks = torch.tensor(sample(logits, params, [gen] * 4000))
    share = (picks == 0).float().mean().item()
    assert (picks != 2).all()  # outside the nucleus
    assert abs(share - 2 / 3) < 0.03  # renormalized 0.6 / 0.9


def test_greedy_and_seeded_rows_in_one_batch():
    logits = torch.randn(3, 100)
    params = [SamplingParams(), SamplingParams(temperature=0.7, seed=5), SamplingParams(temperature=0.7, seed=5)]
    gens = [None, torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)]
    out = sample(logits, params, gens)
    assert out[0] == int(logits[0].argmax())
    assert out[1] == int(sample(logits[1:2], params[1:2], [torch.Generator().manual_seed(5)])[0])
