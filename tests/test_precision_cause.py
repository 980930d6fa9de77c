"""precision_cause names why a candidate's numbers differ, by controlled re-runs: each kind of synthetic kernel,
20 seeds each, over random shapes, weight layouts, partial sizes and block positions."""
from __future__ import annotations

from typing import Callable

import pytest
import torch
import torch.nn.functional as F

import check_cases as cc
from infragent.engine.precision import round_tf32
from infragent.probes.check import run_check
from infragent.probes.inputs import Case
from infragent.probes.precision_cause import precision_cause, round_significand

SEEDS = range(20)
Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def product(x: torch.Tensor, w: torch.Tensor, layout: str) -> torch.Tensor:
    """x @ w for w [K, N] ("kn"), F.linear(x, w) for w [N, K] ("nk")."""
    return x @ w if layout == "kn" else F.linear(x, w)


def k_slice(w: torch.Tensor, layout: str, start: int, stop: int) -> torch.Tensor:
    return w[start:stop] if layout == "kn" else w[:, start:stop]


def partials(x: torch.Tensor, w: torch.Tensor, layout: str, part: int) -> list[torch.Tensor]:
    """fp32 products of part-wide K slices, in order."""
    return [product(x[:, i:i + part], k_slice(w, layout, i, i + part), layout) for i in range(0, x.shape[1], part)]


def bf16_reduction(layout: str, part: int) -> Kernel:
    """fp32 partial sums over part-wide K slices, each rounded to bf16 and added in bf16 (the seed's case study)."""
    def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.bfloat16)
        for p in partials(x, w, layout, part):
            total = total + p.bfloat16()
        return total.float()
    return kernel


def reversed_order(layout: str, part: int) -> Kernel:
    """fp32 throughout, the K slices summed last to first."""
    def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        pieces = partials(x, w, layout, part)[::-1]
        total = pieces[0]
        for p in pieces[1:]:
            total = total + p
        return total
    return kernel


def dropped_block(layout: str, start: int) -> Kernel:
    """Leaves out a 32-wide block of the reduction."""
    def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return product(x, w, layout) - product(x[:, start:start + 32], k_slice(w, layout, start, start + 32), layout)
    return kernel


def kernel_of(kind: str, layout: str, part: int, start: int) -> Kernel:
    """The synthetic candidate of this kind."""
    if kind == "bf16 operands":
        return lambda x, w: product(x.bfloat16().float(), w.bfloat16().float(), layout)
    if kind == "tf32 operands":
        return lambda x, w: product(round_tf32(x), round_tf32(w), layout)
    if kind == "bf16 reduction of fp32 partials":
        return bf16_reduction(layout, part)
    if kind == "fp32, another summation order":
        return reversed_order(layout, part)
    if kind == "a dropped block":
        return dropped_block(layout, start)
    assert kind == "bf16 output"
    return lambda x, w: product(x, w, layout).bfloat16().float()


def drawn(seed: int) -> tuple[Case, str, int, int]:
    """(case, layout, partial size, dropped block's start): M 2-64, N 3-64, K 256-2048 with at least 4 partials."""
    g = torch.Generator().manual_seed(1000 + seed)
    pick = lambda options: options[int(torch.randint(0, len(options), (1,), generator=g))]  # noqa: E731
    m, n = int(torch.randint(2, 65, (1,), generator=g)), int(torch.randint(3, 65, (1,), generator=g))
    k, layout, part = pick([256, 512, 1024, 2048]), pick(["kn", "nk"]), pick([32, 64])
    start = 32 * int(torch.randint(0, k // 32, (1,), generator=g))
    x = torch.randn(m, k, generator=g)
    w = torch.randn(k, n, generator=g) if layout == "kn" else torch.randn(n, k, generator=g)
    return Case((x, w), label=f"{m}x{k}x{n} {layout}", reduction=k), layout, part, start


def reference_of(layout: str) -> Kernel:
    return lambda x, w: product(x, w, layout)


EXPECTED = {"bf16 operands": "operand rounding", "tf32 operands": "operand rounding",
            "bf16 reduction of fp32 partials": "low-precision accumulation",
            "fp32, another summation order": "summation order", "a dropped block": "wrong values",
            "bf16 output": "output rounding"}


@pytest.mark.parametrize("kind", list(EXPECTED))
def test_each_precision_cause_is_named_on_20_of_20_seeds(kind: str) -> None:
    wrong = []
    for seed in SEEDS:
        case, layout, part, start = drawn(seed)
        found = precision_cause(kernel_of(kind, layout, part, start), reference_of(layout), case, seed=seed)
        right = found.cause == EXPECTED[kind]
        if kind == "bf16 operands":
            right = right and found.precision.startswith("bf16")
        if kind == "tf32 operands":
            right = right and found.precision.startswith("tf32")
        if kind == "bf16 reduction of fp32 partials":
            right = right and found.threshold_k == 2 * part  # the error grows once two partials are added
        if kind == "a dropped block":
            right = right and found.threshold_k is not None and found.threshold_k > start
        if not right:
            wrong.append((seed, case.label, part, start, found.cause, found.threshold_k, found.finding))
    assert not wrong, wrong


def test_the_finding_says_what_was_measured() -> None:
    case, layout, part, _ = drawn(3)
    found = precision_cause(bf16_reduction(layout, 64), reference_of(layout), case)
    assert "grows with K" in found.finding and "from K=128" in found.finding and "partial sums of about 64" in found.finding
    assert found.evidence["error_by_k"]["16"] < found.evidence["error_by_k"]["128"]
    operands = precision_cause(kernel_of("bf16 operands", layout, part, 0), reference_of(layout), case)
    assert "exact in 8 significant bits" in operands.finding and "exact in 11 bits it stays" in operands.finding


def test_a_candidate_that_raises_on_changed_inputs_is_unknown_with_the_reason() -> None:
    case, layout, _, _ = drawn(0)
    calls = []

    def picky(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if len(calls) > 1:
            raise ValueError("only the first call is served")
        return product(x.bfloat16().float(), w.bfloat16().float(), layout)

    found = precision_cause(picky, reference_of(layout), case)
    assert found.cause == "unknown" and "ValueError: only the first call is served" in found.finding


def test_a_matching_candidate_has_no_cause() -> None:
    case, layout, _, _ = drawn(1)
    assert precision_cause(reference_of(layout), reference_of(layout), case).cause == "unknown"


def test_round_significand_keeps_exactly_that_many_bits() -> None:
    t = torch.randn(1000, dtype=torch.float64)
    assert torch.equal(round_significand(t.float(), 8), t.float().bfloat16().float())
    assert torch.equal(round_significand(t.float(), 11), round_tf32(t.float()))


def test_check_names_a_bf16_reduction_and_says_all_shards_differ() -> None:
    fb = run_check(bf16_reduction("kn", 64), cc.matmul, cc.long_k_inputs, partition="splitk:4", trials=3)
    assert fb.verdict == "fail"
    assert "cause: accumulation or reduction at reduced precision" in fb.finding, fb.finding
    assert "from K=128" in fb.finding and "all 4 shards differ too" in fb.finding, fb.finding
    assert "typical of" not in fb.finding
    assert fb.details["precision_cause"]["threshold_k"] == 128
    assert "splitk:N" not in " ".join(fb.next_probes)  # a partition was given


def test_check_names_bf16_operands() -> None:
    fb = run_check(kernel_of("bf16 operands", "kn", 64, 0), cc.matmul, cc.long_k_inputs, trials=3)
    assert fb.verdict == "fail" and "cause: operands rounded to bf16" in fb.finding, fb.finding
    assert any("splitk:N" in p for p in fb.next_probes)
