"""Which probe to run next: every probe has a cost class, and the loop runs the cheapest probe that can
refute an open hypothesis (check < bench < record/analyze/trace/gil/roofline < loadgen < end to end).
A probe's next_probes (free text such as "infragent gil WORKLOAD (...)") name the probes worth running
next; probes_in() reads the names out of them so they can pose the next hypotheses.
"""
from __future__ import annotations

import re

PROBE_COST = {
    "check": 0, "quality": 0, "tests": 0,
    "bench": 1, "bench_reference": 1, "step_bench": 1,
    "record": 2, "analyze": 2, "trace": 2, "gil": 2, "roofline": 2,
    "local_ab": 3, "loadgen": 3,
    "end_to_end": 4,
}
_NAMED = re.compile(r"\b(" + "|".join(sorted(PROBE_COST, key=len, reverse=True)) + r")\b")


def cost_of(probe: str) -> int:
    """The probe's cost class (unknown probes cost as much as an end-to-end run)."""
    return PROBE_COST.get(probe, PROBE_COST["end_to_end"])


def probes_in(next_probes: list[str]) -> list[str]:
    """The probe each suggestion names first, in order, once each."""
    named = [m.group(1) for text in next_probes for m in [_NAMED.search(text)] if m]
    return list(dict.fromkeys(named))
