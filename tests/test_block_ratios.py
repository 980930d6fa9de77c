"""The local A/B's per-block ratio: with equal outputs it is the ratio of latencies; where one side's server cut
its requests short it compares time per token delivered, so a server that did less work is not read as faster."""
from __future__ import annotations

import math

from infragent.analysis.blocks import block_log_ratios, output_shortfall
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
