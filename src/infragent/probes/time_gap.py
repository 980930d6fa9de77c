"""When a kernel is slower than its reference by far more than its extra FLOPs explain, what else is there.

FLOPs explain at most the FLOP ratio. The rest is work that is not arithmetic, counted by the same run that
counted the FLOPs: host syncs (.item(), .tolist(), nonzero, copies to the host: the host stops for a result),
the number of torch ops (each costs at least the measured per-op floor), and a loop that runs the reference's
ops many times over (chunks).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from infragent.probes.work import WorkCount

BEYOND = 1.5  # a time ratio this many times the FLOP ratio (or more) calls for an explanation


@dataclass
class TimeGap:
    """The candidate's time against the reference's, and the non-arithmetic work each side did."""

    time_ratio: float
    flop_ratio: float
    gap_s: float  # candidate time minus what the FLOP ratio explains: t - t_ref * flop_ratio
    syncs: int
    reference_syncs: int
    ops: int
    reference_ops: int
    op_floor_s: float
    chunks: float | None  # how many times as often the roles both sides share ran (None: no shared role)

    @property
    def wide(self) -> bool:
        """Whether the time ratio is far beyond the FLOP ratio."""
        return self.time_ratio > BEYOND * self.flop_ratio and self.gap_s > 0

    @property
    def op_overhead_s(self) -> float:
        """The extra ops' time at the per-op floor: a lower bound on what they cost."""
        return max(0, self.ops - self.reference_ops) * self.op_floor_s


def time_gap(work: WorkCount, reference: WorkCount, t_s: float, t_reference_s: float,
             op_floor_s: float) -> TimeGap | None:
    """The gap between the two calls' times beyond their FLOP ratio; None without both FLOP counts and times."""
    if reference.flops <= 0 or work.flops <= 0 or t_reference_s <= 0:
        return None
    flop_ratio = work.flops / reference.flops
    shared = [calls / reference.by_role[r][0] for r, (calls, _) in work.by_role.items()
              if reference.by_role.get(r, (0, 0))[0] > 0]
    return TimeGap(t_s / t_reference_s, flop_ratio, t_s - t_reference_s * flop_ratio, work.syncs, reference.syncs,
                   work.ops, reference.ops, op_floor_s, statistics.median(shared) if shared else None)


def describe(gap: TimeGap) -> str:
    """'x3.20 the reference's time for x1.28 its FLOPs: the other 1.2 ms is not arithmetic: 16 host syncs per
    call (the reference: 0); 214 torch ops for its 9 (at the 2.1 µs per-op floor, at least 0.4 ms); a loop:
    the roles both share run 8x as often (chunks)'."""
    said = []
    if gap.syncs > gap.reference_syncs:
        said.append(f"{gap.syncs} host syncs per call (.item(), .tolist(), nonzero or a copy to the host; the "
                    f"reference: {gap.reference_syncs}), each a stop until the result is ready")
    if gap.ops > gap.reference_ops:
        said.append(f"{gap.ops} torch ops for its {gap.reference_ops} (x{gap.ops / max(1, gap.reference_ops):.1f}; at "
                    f"the {gap.op_floor_s * 1e6:.2g} µs per-op floor, at least {_ms(gap.op_overhead_s)} of the gap)")
    if gap.chunks is not None and gap.chunks >= 2:
        said.append(f"a loop: the roles both sides share run {gap.chunks:.0f}x as often as the reference's (a loop "
                    "over chunks, each a round of small ops)")
    head = (f"x{gap.time_ratio:.2f} the reference's time for x{gap.flop_ratio:.2f} its FLOPs: the other "
            f"{_ms(gap.gap_s)} is not arithmetic")
    return head + (": " + "; ".join(said) if said else ": no sync, op count or loop explains it (memory traffic?)")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2g} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.3g} µs"
