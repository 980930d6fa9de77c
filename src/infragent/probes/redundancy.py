"""Where a kernel's extra FLOPs over its reference come from, op by op.

Two shapes of waste look different in per-op counts: work *recomputed* (a whole multiple N of the
reference's FLOPs, in at least N times its calls, e.g. a normalization redone in every tile) and work
*inflated* (more FLOPs than the reference's by a fraction, e.g. a padded dimension).
"""
from __future__ import annotations

from dataclasses import dataclass

from infragent.probes.work import WorkCount

WHOLE = 0.05  # a FLOP ratio within 5% of a whole number N >= 2 is N repetitions
MIN_EXTRA = 0.01  # ops with less than 1% more FLOPs than the reference's are not extra


@dataclass
class ExtraWork:
    """One op's FLOPs beyond the reference's."""

    op: str
    kind: str  # recomputed | inflated | not in the reference
    calls: int
    reference_calls: int
    flops: float
    reference_flops: float
    grown: str = ""  # the dimensions larger than the reference's in this op's operands, e.g. "96 → 128"

    @property
    def extra_flops(self) -> float:
        return self.flops - self.reference_flops

    @property
    def repeat(self) -> float:
        """How many times the reference's work the op does."""
        return self.flops / self.reference_flops if self.reference_flops else float("inf")


def extra_work(work: WorkCount, reference: WorkCount) -> list[ExtraWork]:
    """Ops with more FLOPs than in the reference, largest excess first."""
    rows = []
    for op, (calls, flops) in work.by_op.items():
        ref_calls, ref_flops = reference.by_op.get(op, (0, 0.0))
        if flops <= 0 or flops <= ref_flops * (1 + MIN_EXTRA):
            continue
        if ref_calls == 0:
            kind = "not in the reference"
        elif (n := round(flops / ref_flops)) >= 2 and abs(flops / ref_flops - n) <= WHOLE * n and calls >= n * ref_calls:
            kind = "recomputed"
        else:
            kind = "inflated"
        grown = _grown(work.shapes.get(op, []), reference.shapes.get(op, [])) if kind == "inflated" else ""
        rows.append(ExtraWork(op, kind, calls, ref_calls, flops, ref_flops, grown))
    return sorted(rows, key=lambda r: -r.extra_flops)


def describe(rows: list[ExtraWork], total_flops: float) -> str:
    """'recomputed 4x the reference's work: exp, sum (2.1% of FLOPs); inflated: bmm 1.33x, ... (...)'."""
    parts = []
    recomputed = [r for r in rows if r.kind == "recomputed"]
    for repeat in sorted({round(r.repeat) for r in recomputed}, reverse=True):
        group = [r for r in recomputed if round(r.repeat) == repeat]
        share = sum(r.extra_flops for r in group) / total_flops
        parts.append(f"recomputed {repeat}x the reference's work: {', '.join(r.op for r in group)} "
                     f"({share:.1%} of FLOPs)")
    inflated = [r for r in rows if r.kind == "inflated"]
    if inflated:
        parts.append("inflated: " + ", ".join(f"{r.op} {r.repeat:.2f}x" + (f" (dimension {r.grown})" if r.grown else "")
                                              for r in inflated[:4])
                     + f" the reference's FLOPs ({sum(r.extra_flops for r in inflated) / total_flops:.1%} of FLOPs)")
    extra = [r for r in rows if r.kind == "not in the reference"]
    if extra:
        parts.append(f"not in the reference: {', '.join(r.op for r in extra)} "
                     f"({sum(r.flops for r in extra) / total_flops:.1%} of FLOPs)")
    return "; ".join(parts)


def _grown(mine: list[list[list[int]]], theirs: list[list[list[int]]]) -> str:
    """'96 → 128' when an op's operands match the reference's in rank but some dimensions are only larger
    (padding); '' when the shapes do not show it."""
    changes: set[tuple[int, int]] = set()
    for ours in mine:
        for ref in theirs:
            if len(ours) != len(ref) or any(len(a) != len(b) for a, b in zip(ours, ref)):
                continue
            diffs = {(b, a) for x, y in zip(ours, ref) for a, b in zip(x, y) if a != b and b != 1}  # 1: broadcast
            if diffs and all(a > b for b, a in diffs):
                changes |= diffs
                break
    return ", ".join(f"{b} → {a}" for b, a in sorted(changes))
