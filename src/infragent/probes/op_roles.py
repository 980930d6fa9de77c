"""What each dispatched op does, by role rather than by name, and the work inside fused ops.

Two kernels that compute the same thing rarely dispatch the same ops: one calls a fused softmax, the other
amax, sub, exp, sum and div; one scales the scores by a scalar divide, the other normalizes by a row-sum
divide. Redundancy is only meaningful when both sides are counted the same way, so:

- every op gets a role: "matmul", "row max", "row sum", a unary op's name ("exp"), or what a binary op does
  by how its operands broadcast: "scalar scale" (x / s or x * (1/s)), "row-wise scale" (a normalization by a
  per-row value), "row-wise shift" (x minus its row's max), "feature-wise scale" / "feature-wise shift" (an
  affine weight or bias), "elementwise add" (same-shaped operands, named by the op);
- a fused op (softmax, log-softmax, layer norm, RMS norm, scaled-dot-product attention) is expanded into the
  roles its decomposition would dispatch, with the FLOPs of work.py's conventions (1 per output element of a
  pointwise op, 1 per input element of a reduction, 2*M*K*N for a matmul).
"""
from __future__ import annotations

import math
from typing import Any

import torch

SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2"})  # the host waits
ROW_MAX = frozenset({"amax", "amin", "max", "min", "argmax", "argmin", "logsumexp"})
ROW_SUM = frozenset({"sum", "mean", "nansum", "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm"})
BINARY = frozenset({"add", "sub", "mul", "div", "rsub", "maximum", "minimum", "pow", "true_divide"})


def role(name: str, args: tuple, out: Any) -> str:
    """The role of one dispatched (non-fused) op with these operands: see the module docstring."""
    if name in ROW_MAX:
        return "row max"
    if name in ROW_SUM:
        return "row sum"
    if name not in BINARY:
        return name
    shapes = [tuple(a.shape) if isinstance(a, torch.Tensor) else () for a in args[:2]]
    out_shape = tuple(out.shape) if isinstance(out, torch.Tensor) else max(shapes, key=len, default=())
    kind = broadcast_kind(shapes, out_shape)
    if kind != "elementwise" and name in KIND_OF_OP:
        return f"{kind} {KIND_OF_OP[name]}"  # x / s and x * (1 / s) do the same work
    return f"{kind} {name}"


KIND_OF_OP = {"mul": "scale", "div": "scale", "true_divide": "scale", "add": "shift", "sub": "shift", "rsub": "shift"}


def broadcast_kind(shapes: list[tuple[int, ...]], out: tuple[int, ...]) -> str:
    """scalar | row-wise | feature-wise | elementwise: how the smaller operand of a binary op meets the output."""
    if len(shapes) < 2 or any(math.prod(s) <= 1 for s in shapes) and math.prod(out) > 1:
        return "scalar"
    if all(s == out for s in shapes):
        return "elementwise"
    if out and out[-1] > 1 and any(s and s[-1] == 1 for s in shapes):
        return "row-wise"  # one operand holds one value per row: a normalization, a shift by the row's max
    return "feature-wise"  # broadcast over the leading dimensions: a weight or bias per feature


def fused(name: str, args: tuple, kwargs: dict) -> list[tuple[str, float]] | None:
    """(role, FLOPs) of the work inside a fused op, as its decomposition would count it; None if not fused."""
    if name in ("_softmax", "softmax", "_safe_softmax"):
        x, dim = args[0], args[1] if len(args) > 1 else -1
        return _softmax_parts(x.numel())
    if name in ("_log_softmax", "log_softmax"):
        x, dim = args[0], args[1] if len(args) > 1 else -1
        n, rows = x.numel(), _rows(x, dim)
        return [("row max", n), ("row-wise shift", n), ("exp", n), ("row sum", n), ("log", rows),
                ("row-wise shift", n)]
    if name == "native_layer_norm":
        x, shape = args[0], args[1]
        n, rows = x.numel(), x.numel() // max(1, math.prod(shape))
        parts = [("row sum", n), ("row-wise shift", n), ("elementwise mul", n), ("row sum", n),
                 ("scalar shift", rows), ("rsqrt", rows), ("row-wise scale", n)]
        return parts + _affine(args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else None, n)
    if name in ("_fused_rms_norm", "rms_norm"):
        x, shape = args[0], args[1]
        n, rows = x.numel(), x.numel() // max(1, math.prod(shape))
        parts = [("elementwise mul", n), ("row sum", n), ("scalar shift", rows), ("rsqrt", rows),
                 ("row-wise scale", n)]
        return parts + _affine(args[2] if len(args) > 2 else kwargs.get("weight"), None, n)
    if name.startswith("_scaled_dot_product") and not name.endswith("backward"):
        q, k, v = args[:3]
        scores = q.numel() // q.shape[-1] * k.shape[-2]  # B*H*L*S
        return ([("matmul", 2.0 * scores * q.shape[-1]), ("scalar scale", scores)]
                + _softmax_parts(scores) + [("matmul", 2.0 * scores * v.shape[-1])])
    return None


def _softmax_parts(n: int) -> list[tuple[str, float]]:
    return [("row max", n), ("row-wise shift", n), ("exp", n), ("row sum", n), ("row-wise scale", n)]


def _affine(weight: Any, bias: Any, n: int) -> list[tuple[str, float]]:
    return ([("feature-wise scale", n)] if isinstance(weight, torch.Tensor) else []) + (
        [("feature-wise shift", n)] if isinstance(bias, torch.Tensor) else [])


def _rows(x: torch.Tensor, dim: int) -> int:
    return x.numel() // max(1, x.shape[dim]) if x.dim() else 1
