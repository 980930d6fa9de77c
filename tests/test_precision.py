"""Precision modes measured against fp64: bf16 is far worse than fp32, 3-pass splits recover accuracy."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.precision import round_bf16, round_tf32, split
from infragent.probes.precision import (MODES, matmul, matmul_error, ordered_bits, render_matmul_error, tolerance,
                                        ulp_distance)

KS = (64, 1024, 4096)


@pytest.fixture(scope="module")
def errors():
    """{(mode, K): ModeError} for every mode on CPU (emulated), measured against an fp64 matmul."""
    return {(r.mode, r.k): r for r in matmul_error(MODES, KS)}


def test_fp32_error_is_measured_against_fp64(errors):
    for k in KS:
        assert 0 < errors["fp32", k].max_rel_err < 1e-5  # nonzero: the reference is more precise than fp32
        assert errors["fp32", k].mean_abs_err > 0


def test_bf16_is_at_least_100x_worse_than_fp32(errors):
    for k in KS:
        assert errors["bf16", k].max_rel_err >= 100 * errors["fp32", k].max_rel_err
        assert errors["bf16", k].mean_abs_err >= 100 * errors["fp32", k].mean_abs_err


def test_bf16x3_is_100x_better_than_bf16_and_within_64x_of_fp32(errors):
    for k in KS:
        assert errors["bf16x3", k].max_rel_err * 100 <= errors["bf16", k].max_rel_err
        assert errors["bf16x3", k].max_rel_err <= 64 * errors["fp32", k].max_rel_err


def test_bf16x3_is_not_fp32_accurate_at_short_k(errors):
    """Two bf16 pieces hold ~16 significand bits (lo·lo and lo's rounding are ~2^-16 per product), so
    at K=64, where fp32's accumulation error is still small, bf16x3 is well over 10x fp32."""
    assert errors["bf16x3", 64].max_rel_err > 10 * errors["fp32", 64].max_rel_err


@pytest.mark.parametrize("mode", ["tf32x3", "bf16x6"])
def test_splits_with_22_plus_bits_are_within_10x_of_fp32(errors, mode):
    for k in KS:
        assert errors[mode, k].max_rel_err <= 10 * errors["fp32", k].max_rel_err
        assert errors[mode, k].mean_abs_err <= 10 * errors["fp32", k].mean_abs_err


def test_tf32_sits_between_bf16_and_fp32(errors):
    for k in KS:
        assert errors["fp32", k].max_rel_err * 100 <= errors["tf32", k].max_rel_err < errors["bf16", k].max_rel_err


def test_render_lists_every_mode_and_k(errors):
    text = render_matmul_error(list(errors.values()))
    assert all(f"K={k}" in text for k in KS) and all(mode in text for mode in MODES)


def test_round_tf32_to_nearest_even_keeps_sign_inf_nan():
    one_ulp = 2.0 ** -10
    x = torch.tensor([1.0, 1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + one_ulp / 2), -(1 + 3 * one_ulp / 2),
                      1 + one_ulp / 2 + 2.0 ** -23, float("inf"), float("-inf"), -0.0])
    expected = [1.0, 1.0, 1 + 2 * one_ulp, -1.0, -(1 + 2 * one_ulp), 1 + one_ulp, float("inf"), float("-inf"), -0.0]
    assert round_tf32(x).tolist() == expected
    assert torch.isnan(round_tf32(torch.tensor([float("nan")]))).all()
    y = torch.randn(10_000) * 1e3
    r = round_tf32(y)
    assert (r.view(torch.int32) & 0x1FFF == 0).all()
    assert ((r - y).abs() <= y.abs() * 2.0 ** -11).all() and (torch.sign(r) == torch.sign(y)).all()


def test_split_pieces_are_representable_and_sum_back():
    x = torch.randn(1000)
    hi, lo = split(x, round_bf16, 2)
    assert torch.equal(hi, x.to(torch.bfloat16).float()) and torch.equal(lo, round_bf16(lo))
    assert ((hi + lo - x).abs() <= x.abs() * 2.0 ** -16).all()
    with pytest.raises(ValueError, match="mode 'fp8'"):
        matmul(x[:4, None], x[None, :4], "fp8")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_ulp_distance_counts_representable_values(dtype):
    one = torch.tensor([1.0], dtype=dtype)
    next_up = torch.nextafter(one, torch.tensor([2.0], dtype=dtype))
    assert ulp_distance(next_up, one).item() == 1
    tiny = torch.nextafter(torch.zeros(1, dtype=dtype), torch.ones(1, dtype=dtype))
    assert ulp_distance(tiny, -tiny).item() == 2  # across zero: -tiny, 0, +tiny
    assert ulp_distance(torch.tensor([-0.0], dtype=dtype), torch.tensor([0.0], dtype=dtype)).item() == 0
    values = torch.tensor([-2.0, -1.0, -0.0, 0.5, 3.0], dtype=dtype)
    assert (ordered_bits(values).diff() >= 0).all()


def test_ulp_distance_is_in_the_candidates_dtype():
    ref = torch.tensor([1.0 + 2.0 ** -7], dtype=torch.float64)  # exactly one bf16 ulp above 1
    assert ulp_distance(torch.tensor([1.0], dtype=torch.bfloat16), ref).item() == 1
    assert ulp_distance(torch.tensor([1.0], dtype=torch.float32), ref).item() == 2 ** 16


def test_tolerance_follows_dtype_and_grows_with_k():
    assert tolerance(torch.float64, 1024) < 1e-12 < tolerance(torch.float32, 1) < 1e-6
    assert 1e-5 < tolerance(torch.float32, 1024) < 3e-5
    assert tolerance(torch.float32, 4096) > tolerance(torch.float32, 64)
    assert 1e-3 < tolerance(torch.float16, 1) < 3e-3 and 1e-2 < tolerance(torch.bfloat16, 1024) < 2e-2
    assert tolerance(torch.int32, 1024) == 0.0


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
def test_cuda_modes_against_fp64_and_settings_restored():
    backend = torch.backends.cuda.matmul
    before = backend.fp32_precision if hasattr(backend, "fp32_precision") else backend.allow_tf32
    rows = {(r.mode, r.k): r for r in matmul_error(MODES, KS, device="cuda")}
    after = backend.fp32_precision if hasattr(backend, "fp32_precision") else backend.allow_tf32
    assert before == after
    for k in KS:
        fp32 = rows["fp32", k].max_rel_err
        assert 0 < fp32 < 1e-5  # TF32 really off in fp32 mode
        assert rows["tf32", k].max_rel_err >= 100 * fp32  # the hardware TF32 path really ran
        assert rows["tf32x3", k].max_rel_err <= 10 * fp32
        assert rows["bf16", k].max_rel_err >= 100 * fp32
        assert rows["bf16x3", k].max_rel_err <= 64 * fp32


@cuda
def test_cuda_tf32x3_matches_cpu_emulation():
    a, b = torch.randn(64, 1024), torch.randn(1024, 64)
    gpu = matmul(a.cuda(), b.cuda(), "tf32x3").cpu()
    cpu = matmul(a, b, "tf32x3")
    assert (gpu - cpu).abs().max() <= 1e-4 * (a.double() @ b.double()).abs().max()
