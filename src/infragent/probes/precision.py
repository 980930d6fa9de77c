"""Floating-point precision: tolerances, ULP distance, emulated matmul precision modes, error vs fp64.

The matmul precision modes live in engine/precision.py (the engine runs them too); re-exported here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from infragent.engine.precision import MODES, matmul

_SIGN_MASK = {torch.float16: 0x7FFF, torch.bfloat16: 0x7FFF, torch.float32: 0x7FFFFFFF,
              torch.float64: 0x7FFFFFFFFFFFFFFF}
_INT_VIEW = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
             torch.float64: torch.int64}


def unit_roundoff(dtype: torch.dtype) -> float:
    """Half the machine epsilon of a floating dtype (0.0 for integer and bool dtypes: exact)."""
    if not dtype.is_floating_point and not dtype.is_complex:
        return 0.0
    if dtype.is_complex:
        dtype = torch.float64 if dtype == torch.complex128 else torch.float32
    return torch.finfo(dtype).eps / 2


def tolerance(dtype: torch.dtype, reduction: int | None = None) -> float:
    """Relative tolerance for an output of dtype whose elements each sum `reduction` terms.

    tol = 4·u(dtype) + 8·u(acc)·sqrt(K), u = unit roundoff, acc = fp64 for fp64 outputs else fp32.
    The first term covers the candidate and the reference each rounding the result to dtype
    (bf16 1.6e-2, fp16 2.0e-3, fp32 2.4e-7); the second covers fp32 (fp64) accumulation, whose
    random-walk error grows as sqrt(K) (fp32: 1.5e-5 at K=1024). Errors are measured relative to
    max(|reference|, rms(reference)), so cancellation near zero does not inflate them.
    Integer and bool outputs must match exactly (tol 0).
    """
    u_out = unit_roundoff(dtype)
    if u_out == 0.0:
        return 0.0
    u_acc = unit_roundoff(torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32)
    return 4 * u_out + 8 * u_acc * math.sqrt(max(reduction or 1, 1))


def ordered_bits(x: torch.Tensor) -> torch.Tensor:
    """Float bits as int64 ordered like the values (sign-magnitude to two's complement; +0 == -0)."""
    bits = x.contiguous().view(_INT_VIEW[x.dtype]).to(torch.int64)
    magnitude = bits & _SIGN_MASK[x.dtype]
    return torch.where(bits < 0, -magnitude, magnitude)


def ulp_distance(candidate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """Elementwise distance in units in the last place of candidate's dtype (reference rounded to it).

    float64 distances come back as float64 (exact below 2^53); other dtypes as int64. Integer
    dtypes return the absolute difference.
    """
    if candidate.dtype not in _INT_VIEW:
        return (candidate.to(torch.float64) - reference.to(torch.float64)).abs()
    ref = reference.to(candidate.dtype)
    a, b = ordered_bits(candidate), ordered_bits(ref)
    if candidate.dtype == torch.float64:  # int64 a - b can overflow only across zero
        across = (a < 0) != (b < 0)
        return torch.where(across, a.to(torch.float64).abs() + b.to(torch.float64).abs(),
                           (a - b).abs().to(torch.float64))
    return (a - b).abs()


def relative_error(candidate: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """|c - r| / max(|r|, rms(r)) elementwise in fp64 (the floor keeps near-zero results meaningful)."""
    c, r = candidate.to(torch.float64), reference.to(torch.float64)
    floor = max(r.pow(2).mean().sqrt().item() if r.numel() else 0.0, torch.finfo(torch.float64).tiny)
    return (c - r).abs() / r.abs().clamp_min(floor)


# log2 of the max relative error (vs max(|ref|, rms(ref))) each operand precision gives on standard-normal
# fp32 operands, K 64..4096, measured with matmul_error on CPU: it barely moves with K.
ERROR_LEVELS = {"bf16 operands (8-bit mantissa)": -6.7, "tf32 or fp16 operands (10-bit mantissa)": -9.6,
                "the bf16x3 split (about 16 bits)": -15.6, "fp32 (reduction order only)": -19.5}


def likely_precision(max_rel_err: float) -> str:
    """The operand precision whose typical error level is nearest (in log2) to an observed max relative error."""
    if not max_rel_err > 0:
        return "exact"
    level = math.log2(max_rel_err)
    return min(ERROR_LEVELS, key=lambda name: abs(ERROR_LEVELS[name] - level))


@dataclass
class ModeError:
    """Error of one precision mode at one reduction length K, measured against an fp64 matmul."""

    mode: str
    k: int
    max_rel_err: float  # max |c - r| / max(|r|, rms(r))
    mean_abs_err: float
    device: str


def matmul_error(modes: tuple[str, ...] = MODES, ks: tuple[int, ...] = (64, 256, 1024, 4096),
                 m: int = 64, n: int = 64, seed: int = 0, device: str = "cpu") -> list[ModeError]:
    """Error vs fp64 of each mode's [m, K] @ [K, n] on standard-normal operands, for each K."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for k in ks:
        a = torch.randn(m, k, generator=generator)
        b = torch.randn(k, n, generator=generator)
        exact = a.double() @ b.double()
        a_dev, b_dev = a.to(device), b.to(device)
        for mode in modes:
            out = matmul(a_dev, b_dev, mode).cpu()
            rows.append(ModeError(mode, k, relative_error(out, exact).max().item(),
                                  (out.double() - exact).abs().mean().item(), device))
    return rows


def render_matmul_error(rows: list[ModeError]) -> str:
    """A table: one line per mode, max rel err vs fp64 for each K."""
    ks = sorted({r.k for r in rows})
    modes = list(dict.fromkeys(r.mode for r in rows))
    by = {(r.mode, r.k): r for r in rows}
    lines = ["max rel err vs fp64  " + "  ".join(f"K={k:<7}" for k in ks)]
    for mode in modes:
        lines.append(f"  {mode:<18} " + "  ".join(f"{by[mode, k].max_rel_err:<9.2e}" for k in ks))
    return "\n".join(lines)
