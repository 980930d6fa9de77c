"""Elementwise comparison of a candidate's outputs with a reference's: errors, ULPs, first bad index."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from infragent.probes.inputs import tensors_of
from infragent.probes.precision import relative_error, tolerance, ulp_distance


@dataclass
class OutputDiff:
    """How a candidate's outputs differ from the reference's (outputs flattened in order)."""

    ok: bool = True
    problem: str = ""  # a structural difference (output count or shape), when there is one
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    max_ulp: float = 0.0
    tol: float = 0.0
    bad: int = 0
    total: int = 0
    output: int = 0  # which output tensor holds first_bad_index
    shape: tuple[int, ...] = ()
    first_bad_index: tuple[int, ...] | None = None
    zeros: int = 0  # bad elements where the candidate is exactly 0 and the reference is not (values missing)
    nonfinite: int = 0  # candidate NaN/Inf where the reference is finite
    first_nonfinite: tuple[int, ...] | None = None
    bad_mask: torch.Tensor | None = field(default=None, repr=False)

    def row(self) -> dict[str, Any]:
        """JSON-safe summary."""
        return {"max_abs_err": self.max_abs_err, "max_rel_err": self.max_rel_err, "max_ulp": self.max_ulp,
                "tol": self.tol, "bad": self.bad, "zeros": self.zeros, "total": self.total, "problem": self.problem,
                "first_bad_index": list(self.first_bad_index) if self.first_bad_index else None}


def output_tensors(value: Any) -> list[torch.Tensor]:
    tensors = tensors_of(value)
    if not tensors and isinstance(value, (int, float, bool)):
        return [torch.tensor(value)]
    return tensors


def _rms(x: torch.Tensor) -> float:
    return x.pow(2).mean().sqrt().item() if x.numel() else 0.0


def _first(mask: torch.Tensor) -> tuple[int, ...]:
    flat = int(mask.reshape(-1).to(torch.uint8).argmax())
    index = []
    for size in reversed(mask.shape):
        flat, position = divmod(flat, size)
        index.append(position)
    return tuple(reversed(index))


def diff_outputs(candidate: Any, reference: Any, reduction: int | None = None, rtol: float | None = None) -> OutputDiff:
    """Compare outputs element by element: errors, ULPs, bad elements and the first bad index."""
    cands, refs = output_tensors(candidate), output_tensors(reference)
    if len(cands) != len(refs):
        return OutputDiff(False, f"candidate returned {len(cands)} tensors, reference {len(refs)}")
    result = OutputDiff()
    for i, (c, r) in enumerate(zip(cands, refs)):
        name = "output" if len(cands) == 1 else f"output {i}"
        if c.shape != r.shape:
            return OutputDiff(False, f"{name} shape {tuple(c.shape)} != reference {tuple(r.shape)}",
                              output=i, shape=tuple(r.shape))
        c, r = c.detach().cpu(), r.detach().cpu()
        if c.is_complex() or r.is_complex():
            c, r = torch.view_as_real(c.to(torch.complex128)), torch.view_as_real(r.to(torch.complex128))
        tol = rtol if rtol is not None else max(tolerance(c.dtype, reduction), tolerance(r.dtype, reduction))
        c_ok, r_ok = torch.isfinite(c), torch.isfinite(r)
        both = c_ok & r_ok
        finite = bool(both.all())
        zero = torch.zeros((), dtype=torch.float64)
        c64, r64 = (c.double(), r.double()) if finite else (torch.where(both, c.double(), zero),
                                                            torch.where(both, r.double(), zero))
        rel, abs_err = relative_error(c64, r64), (c64 - r64).abs()
        bad = rel > tol
        nonfinite = ~c_ok & r_ok
        if not finite:
            same_special = ~c_ok & ~r_ok & ((c.isnan() & r.isnan()) | (c.double() == r.double()))
            bad = (both & bad) | (~both & ~same_special)
        result.tol = max(result.tol, tol)
        result.total += c.numel()
        result.bad += int(bad.sum())
        result.zeros += int((bad & (c64 == 0) & (r64 != 0)).sum())
        if c.numel():
            result.max_abs_err = max(result.max_abs_err, float(abs_err.max()))
            result.max_rel_err = max(result.max_rel_err, float(rel.max()))
            counted = both & (r64.abs() >= _rms(r64))  # below rms, cancellation makes ULPs meaningless
            if counted.any():
                result.max_ulp = max(result.max_ulp, float(ulp_distance(c[counted], r[counted]).max()))
        if nonfinite.any() and result.first_nonfinite is None:
            result.nonfinite, result.first_nonfinite = int(nonfinite.sum()), _first(nonfinite)
        if bad.any() and result.first_bad_index is None:
            result.output, result.shape, result.bad_mask = i, tuple(c.shape), bad
            result.first_bad_index = _first(bad)
    result.ok = result.bad == 0
    return result
