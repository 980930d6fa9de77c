"""Diff and attribution: a candidate trace against a baseline. Each span name's change in own (exclusive)
time on the critical thread, its share of the end-to-end change, the layers that carry it, and an Amdahl
prediction of the end-to-end change from the span deltas next to the measured one.

On the thread that sets the end time, wall time = the own time of its spans + its idle time, so the span
deltas and the idle delta add up to the measured change exactly; a prediction that misses says the
change moved work onto another thread or into waiting. Amdahl's law for outside (micro-benchmark) ratios:
new/old = sum_i f_i * r_i + (1 - sum_i f_i), with f_i the baseline share of span i and r_i its ratio.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from infragent.analysis.breakdown import exclusive, parents, phase_of, PHASES
from infragent.analysis.trace_columns import TraceColumns


@dataclass
class SpanDelta:
    """One span name's change."""

    name: str
    phase: str
    base_ns: int
    cand_ns: int
    share_of_delta: float  # of the end-to-end delta
    layers: str = ""  # e.g. "layers 0-7" when a `layer` attr locates most of the delta

    @property
    def delta_ns(self) -> int:
        return self.cand_ns - self.base_ns


@dataclass
class TraceDiff:
    """Baseline vs candidate, attributed."""

    metric: str  # what the end-to-end time measures
    base_ns: int
    cand_ns: int
    spans: list[SpanDelta] = field(default_factory=list)
    idle_delta_ns: int = 0
    predicted_ns: int = 0  # base + sum of span deltas (+ idle delta): Amdahl over the decomposition

    @property
    def change(self) -> float:
        """Measured relative change of the end-to-end time."""
        return self.cand_ns / self.base_ns - 1 if self.base_ns else 0.0

    @property
    def predicted_change(self) -> float:
        """Relative change predicted from the span deltas alone (without the idle delta)."""
        return self.predicted_ns / self.base_ns - 1 if self.base_ns else 0.0

    def headline(self, top: int = 3) -> str:
        """e.g. 'TTFT +30.0%: 78% from attention (prefill, layers 0-7); kv.transfer +4.0 ms'."""
        parts = []
        for d in self.spans[:top]:
            where = ", ".join(x for x in (d.phase if d.phase != "other" else "", d.layers) if x)
            parts.append(f"{d.share_of_delta:.0%} from {d.name}" + (f" ({where})" if where else "")
                         + f" {d.delta_ns / 1e6:+.2f} ms")
        return f"{self.metric} {self.change:+.1%}: " + "; ".join(parts)


def amdahl(fractions: dict[str, float], ratios: dict[str, float]) -> float:
    """Predicted end-to-end ratio new/old from baseline time fractions and per-part ratios."""
    covered = sum(fractions[k] for k in ratios if k in fractions)
    return sum(fractions[k] * r for k, r in ratios.items() if k in fractions) + (1 - covered)


def critical_track(c: TraceColumns) -> int:
    """The thread track that ends last among the busiest ones (the one end-to-end time waits for)."""
    top = c.depth == 0
    busy = np.bincount(c.track[top], weights=(c.end - c.start)[top], minlength=len(c.tracks))
    candidates = [t for t in range(len(c.tracks)) if busy[t] >= 0.5 * busy.max()]
    return max(candidates, key=lambda t: c.end[c.track == t].max())


def diff(base: TraceColumns, cand: TraceColumns, metric: str = "wall", top: int = 10) -> TraceDiff:
    """Attribute the change of the critical thread's wall time (metric names it, e.g. 'TTFT') to spans."""
    b_own, c_own = _own_by_key(base), _own_by_key(cand)
    b_wall, b_busy = _wall(base)
    c_wall, c_busy = _wall(cand)
    delta = c_wall - b_wall
    keys = sorted(set(b_own) | set(c_own), key=lambda k: -abs(c_own.get(k, (0, {}))[0] - b_own.get(k, (0, {}))[0]))
    spans = []
    for name, phase in keys[:top]:
        b_ns, b_layers = b_own.get((name, phase), (0, {}))
        c_ns, c_layers = c_own.get((name, phase), (0, {}))
        share = (c_ns - b_ns) / delta if delta else 0.0
        spans.append(SpanDelta(name, phase, b_ns, c_ns, share, _layers(b_layers, c_layers)))
    span_delta = sum(c_own.get(k, (0, {}))[0] - b_own.get(k, (0, {}))[0] for k in set(b_own) | set(c_own))
    idle_delta = (c_wall - c_busy) - (b_wall - b_busy)
    return TraceDiff(metric, b_wall, c_wall, spans, idle_delta, b_wall + span_delta)


def _wall(c: TraceColumns) -> tuple[int, int]:
    t = critical_track(c)
    top = (c.track == t) & (c.depth == 0)
    return int(c.end[top].max() - c.start[top].min()), int((c.end - c.start)[top].sum())


def _own_by_key(c: TraceColumns) -> dict[tuple[str, str], tuple[int, dict[int, int]]]:
    """(name, phase) → (own ns on the critical track, own ns per `layer` attr)."""
    parent = parents(c)
    own, phase = exclusive(c, parent), phase_of(c, parent)
    t = critical_track(c)
    labels = [*PHASES, "other"]
    out: dict[tuple[str, str], tuple[int, dict[int, int]]] = {}
    rows = np.flatnonzero(c.track == t)
    keyed = np.stack([c.name[rows], phase[rows]], axis=1)
    uniq, inverse = np.unique(keyed, axis=0, return_inverse=True)
    sums = np.bincount(inverse.ravel(), weights=own[rows], minlength=len(uniq))
    for (n, p), total in zip(uniq.tolist(), sums.tolist()):
        out[(c.names[n], labels[p])] = (int(total), {})
    if c.args is not None:
        for row in rows.tolist():
            layer = c.attrs(row).get("layer") if c.args[row] is not None else None
            if isinstance(layer, int):
                key = (c.names[c.name[row]], labels[phase[row]])
                per = out[key][1]
                per[layer] = per.get(layer, 0) + int(own[row])
    return out


def _layers(base: dict[int, int], cand: dict[int, int]) -> str:
    """The smallest set of layers carrying 80% of the delta, as ranges ('layers 0-7, 12')."""
    deltas = {k: cand.get(k, 0) - base.get(k, 0) for k in set(base) | set(cand)}
    total = sum(deltas.values())
    if not deltas or total == 0:
        return ""
    picked, acc = [], 0
    for layer, d in sorted(deltas.items(), key=lambda kv: -kv[1] * np.sign(total)):
        picked.append(layer)
        acc += d
        if acc / total >= 0.8:
            break
    if len(picked) == len(deltas) and len(deltas) > 1:
        return "all layers"
    return "layers " + _ranges(sorted(picked))


def _ranges(values: list[int]) -> str:
    out, start = [], values[0]
    for prev, cur in zip(values, values[1:] + [None]):
        if cur != prev + 1 if cur is not None else True:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(out)
