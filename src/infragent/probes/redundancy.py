"""Where a kernel's extra FLOPs over its reference come from, role by role (op_roles: a fused softmax on one
side pairs with amax/sub/exp/sum/div on the other, a scale divide never with a normalization divide).

Two shapes of waste look different in per-role counts, and one role can show both: work *padded* (a dimension
larger than the reference's in its operands, e.g. 96 → 128, multiplying its FLOPs by 128/96) and work
*recomputed* (after the padding, a whole multiple N of the reference's FLOPs in at least N times its calls,
e.g. a normalization redone in every chunk of a loop). The extra FLOPs are split between the two.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from infragent.probes.work import WorkCount

WHOLE = 0.05  # a FLOP ratio within 5% of a whole number N >= 2 is N repetitions
MIN_EXTRA = 0.01  # ops with less than 1% more FLOPs than the reference's are not extra


@dataclass
class ExtraWork:
    """One role's FLOPs beyond the reference's (op_roles: fused ops counted as their decomposition)."""

    op: str  # the role, e.g. "matmul", "row-wise div", "exp"
    kind: str  # recomputed | inflated | not in the reference
    calls: int
    reference_calls: int
    flops: float
    reference_flops: float
    grown: str = ""  # the dimensions larger than the reference's in this role's operands, e.g. "96 → 128"
    ops: list[str] = field(default_factory=list)  # the op names that did this role's work
    padding: float = 1.0  # how much the grown dimensions multiply the work by (1: none grew)

    @property
    def extra_flops(self) -> float:
        return self.flops - self.reference_flops

    @property
    def repeat(self) -> float:
        """How many times the reference's work the op does."""
        return self.flops / self.reference_flops if self.reference_flops else float("inf")

    @property
    def padding_flops(self) -> float:
        """The extra FLOPs the grown dimensions account for (once; a recomputation repeats them)."""
        return 0.0 if self.kind == "not in the reference" else min(self.extra_flops,
                                                                     self.reference_flops * (self.padding - 1))

    @property
    def recompute_flops(self) -> float:
        """The extra FLOPs of doing the (padded) work again: all of it beyond the first padded pass."""
        return self.extra_flops - self.padding_flops if self.kind == "recomputed" else 0.0


def extra_work(work: WorkCount, reference: WorkCount) -> list[ExtraWork]:
    """Roles with more FLOPs than in the reference, largest excess first (by op name when either side has no
    roles counted)."""
    mine, theirs = (work.by_role, reference.by_role) if work.by_role and reference.by_role else (work.by_op,
                                                                                                 reference.by_op)
    mine_shapes, their_shapes = ((work.role_shapes, reference.role_shapes) if mine is work.by_role
                                 else (work.shapes, reference.shapes))
    rows = []
    for op, (calls, flops) in mine.items():
        ref_calls, ref_flops = theirs.get(op, (0, 0.0))
        if flops <= 0 or flops <= ref_flops * (1 + MIN_EXTRA):
            continue
        names = work.role_ops.get(op, [op]) if mine is work.by_role else [op]
        if ref_calls == 0 or ref_flops <= 0:
            rows.append(ExtraWork(op, "not in the reference", calls, ref_calls, flops, ref_flops, ops=names))
            continue
        padding, grown = _grown(mine_shapes.get(op, []), their_shapes.get(op, []))
        again = flops / ref_flops / padding
        n = round(again)
        kind = "recomputed" if n >= 2 and abs(again - n) <= WHOLE * n and calls >= n * ref_calls else "inflated"
        rows.append(ExtraWork(op, kind, calls, ref_calls, flops, ref_flops, grown, names, padding))
    return sorted(rows, key=lambda r: -r.extra_flops)


def describe(rows: list[ExtraWork], total_flops: float) -> str:
    """'inflated by padding (dimension 96 → 128): matmul 1.33x ... (...% of FLOPs); recomputed 4x the reference's
    work (in 8 calls for its 1: a loop redoing it): row max (...% of FLOPs); not in the reference: ... (...)'."""
    parts = []
    padded = [r for r in rows if r.padding > 1 and r.padding_flops > 0]
    if padded:
        dims = ", ".join(dict.fromkeys(r.grown for r in padded))
        parts.append("inflated by padding (dimension " + dims + "): "
                     + ", ".join(f"{r.op} {r.padding:.2f}x" for r in padded[:4])
                     + f" the reference's FLOPs ({sum(r.padding_flops for r in padded) / total_flops:.1%} of FLOPs)")
    recomputed = [r for r in rows if r.kind == "recomputed"]
    for repeat in sorted({round(r.repeat / r.padding) for r in recomputed}, reverse=True):
        group = [r for r in recomputed if round(r.repeat / r.padding) == repeat]
        share = sum(r.recompute_flops for r in group) / total_flops
        calls = f"in {group[0].calls} calls for its {group[0].reference_calls}"
        parts.append(f"recomputed {repeat}x the reference's work ({calls}: a loop redoing it): "
                     f"{', '.join(r.op for r in group)} ({share:.1%} of FLOPs)")
    inflated = [r for r in rows if r.kind == "inflated" and r.padding_flops < r.extra_flops * 0.99]
    if inflated:
        parts.append("inflated: " + ", ".join(f"{r.op} {r.repeat:.2f}x" for r in inflated[:4])
                     + " the reference's FLOPs"
                     + f" ({sum(r.extra_flops - r.padding_flops for r in inflated) / total_flops:.1%} of FLOPs"
                       " not explained by padding)")
    extra = [r for r in rows if r.kind == "not in the reference"]
    if extra:
        parts.append(f"not in the reference (fused ops counted as their parts): {', '.join(r.op for r in extra)} "
                     f"({sum(r.flops for r in extra) / total_flops:.1%} of FLOPs)")
    return "; ".join(parts)


def _grown(mine: list[list[list[int]]], theirs: list[list[list[int]]]) -> tuple[float, str]:
    """(how much the grown dimensions multiply the work, '96 → 128'): each of our operands is paired with the
    reference's operand of the same rank that differs from it least; the dimensions that only grew there are
    padding. Dimensions that shrank (a loop's chunks) and broadcast ones (size 1) are not; (1.0, '') when none
    grew. The factor is the largest over our calls, each distinct growth counted once per call."""
    factor, changes = 1.0, set()
    references = [ref for call in theirs for ref in call]
    for call in mine:
        grew: set[tuple[int, int]] = set()
        for ours in call:
            same_rank = [ref for ref in references if len(ref) == len(ours) and ref]
            if not same_rank:
                continue
            ref = min(same_rank, key=lambda r: (sum(a != b for a, b in zip(ours, r)),  # fewest dimensions apart,
                                                abs(math.log(max(1, math.prod(ours)) / max(1, math.prod(r))))))
            grew |= {(b, a) for a, b in zip(ours, ref) if a > b > 1}
        here = 1.0
        for b, a in grew:
            here *= a / b
        factor = max(factor, here)
        changes |= grew
    return factor, ", ".join(f"{b} → {a}" for b, a in sorted(changes))
