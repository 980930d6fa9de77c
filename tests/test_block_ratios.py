"""The local A/B's per-block ratio: with equal outputs it is the ratio of latencies; where one side's server cut
its requests short it compares time per token delivered, so a server that did less work is not read as faster."""
from __future__ import annotations

import math

import pytest

from infragent.analysis.blocks import (MIN_FLOOR, aa_floor, block_estimate, block_log_ratios, block_verdict,
                                       output_shortfall)
from infragent.analysis.serving_metrics import RequestRecord


def _served(i: int, latency: float, tokens: int, asked: int = 16) -> RequestRecord:
    return RequestRecord(i, 64, asked, success=True, latency_s=latency, output_tokens=tokens)


def test_equal_outputs_compare_latencies() -> None:
    base = [_served(i, 1.0, 16) for i in range(4)]
    cand = [_served(i, 0.8, 16) for i in range(4)]
    assert [round(math.exp(r), 6) for r in block_log_ratios(base, cand, 2)] == [0.8, 0.8]
    assert output_shortfall(base) == 0.0


def test_a_side_that_cut_its_requests_short_is_compared_per_token_delivered() -> None:
    interrupted = [_served(i, 0.5, 1) for i in range(4)]  # one token of 16 each, in half the time
    served_whole = [_served(i, 0.9, 16) for i in range(4)]
    ratios = block_log_ratios(interrupted, served_whole, 2)
    assert all(math.exp(r) < 0.2 for r in ratios)  # 0.9/16 s a token against 0.5 s: far less time per token
    assert output_shortfall(interrupted) == 1 - 1 / 16


def test_a_block_with_a_failed_request_or_no_counted_tokens() -> None:
    base = [_served(0, 1.0, 0), _served(1, 1.0, 0), _served(2, 1.0, 16), RequestRecord(3, 64, 16, error="HTTP 500")]
    cand = [_served(0, 0.5, 0), _served(1, 0.5, 0), _served(2, 0.5, 16), _served(3, 0.5, 16)]
    assert [round(math.exp(r), 6) for r in block_log_ratios(base, cand, 2)] == [0.5]  # latencies; block 1 left out


def test_a_larger_batch_is_a_throughput_win_by_makespan_though_each_request_takes_longer() -> None:
    # 4 requests sent at once: two slots serve them in two waves (1 s each); four slots in one wave of 1.6 s
    two_slots = [RequestRecord(i, 64, 16, start_s=0.0, success=True, latency_s=1.0 if i < 2 else 2.0,
                               output_tokens=16) for i in range(4)]
    four_slots = [RequestRecord(i, 64, 16, start_s=0.0, success=True, latency_s=1.6, output_tokens=16)
                  for i in range(4)]
    latency = math.exp(block_log_ratios(two_slots, four_slots, 4, "latency")[0])
    makespan = math.exp(block_log_ratios(two_slots, four_slots, 4, "makespan")[0])
    assert round(latency, 6) == round(6.4 / 6.0, 6)  # the mean request is slower: no win by latency
    assert round(makespan, 6) == 0.8  # the block is done in 1.6 s instead of 2: 25% more tokens per second


def test_makespan_runs_from_the_blocks_first_send_to_its_last_completion() -> None:
    base = [RequestRecord(i, 64, 16, start_s=10.0 + i, success=True, latency_s=1.0, output_tokens=16)
            for i in range(2)]  # sent at 10 and 11, done at 11 and 12: 2 s
    cand = [RequestRecord(i, 64, 16, start_s=50.0 + i, success=True, latency_s=0.5, output_tokens=16)
            for i in range(2)]  # sent at 50 and 51, done at 50.5 and 51.5: 1.5 s
    assert round(math.exp(block_log_ratios(base, cand, 2, "makespan")[0]), 6) == 0.75


def test_an_unknown_block_metric_is_named() -> None:
    with pytest.raises(ValueError, match="'p99'"):
        block_log_ratios([], [], 2, "p99")


def test_the_local_metric_follows_the_objective() -> None:
    from infragent.agent.targets.serving_gates import local_metric
    from infragent.lab.spec import Scenario
    assert local_metric(Scenario(name="chat", max_concurrency=8)) == "makespan"
    assert local_metric(Scenario(name="chat", max_concurrency=8, goodput_ms={"ttft": 200})) == "latency"


# Two real A/A looks from benchmarks/results/local_ab_verdicts-makespan-s36.json (identical servers): their
# centres lie beyond any 2% floor, but their 97.5% intervals reach past it.
AA_LOOKS = ([-0.051, -0.069, -0.035, -0.013, -0.073, -0.023], [-0.053, -0.09, -0.022, -0.064, -0.001, -0.068])
PLANTED_LOOK = [-0.2, -0.186, -0.148, -0.178, -0.153, -0.197]  # the same run's planted 25% decode slowdown


def test_a_local_win_needs_the_whole_interval_beyond_the_floor() -> None:
    floor = aa_floor(block_estimate([0.001, -0.002, 0.003, -0.001, 0.0, 0.002, -0.003, 0.001], 0.975))
    assert floor == MIN_FLOOR
    for look in AA_LOOKS:
        estimate = block_estimate(look, 0.975)
        assert estimate.ratio < math.exp(-floor) and estimate.hi < 1.0  # a centre-beyond-the-floor rule said "win"
        assert block_verdict(estimate, floor) == "inconclusive"
    assert block_verdict(block_estimate(PLANTED_LOOK, 0.975), floor) == "win"
    assert block_verdict(block_estimate([-x for x in PLANTED_LOOK], 0.975), floor) == "loss"


def test_the_aa_floor_is_the_least_unless_a_bias_shows_then_its_outer_bound() -> None:
    noisy = block_estimate([0.09, -0.07, 0.05, -0.08, 0.06, -0.04, 0.02, -0.01], 0.975)
    assert noisy.lo < 1 < noisy.hi and aa_floor(noisy) == MIN_FLOOR  # its noise is in the candidate's interval
    biased = block_estimate([0.05, 0.04, 0.06, 0.05, 0.045, 0.055, 0.05, 0.04], 0.975)
    assert biased.lo > 1 and aa_floor(biased) == pytest.approx(math.log(biased.hi))
    assert aa_floor(biased, least=0.5) == 0.5 and aa_floor(block_estimate([0.01])) == math.inf
