"""analyze: a trace (or two) → Feedback. Breakdown, overlap, never-overlapping pairs, idle gaps, critical
path, and with a baseline the diff with its attribution and Amdahl cross-check.

The verdict is "fail" when the trace shows a signature worth acting on (a pair of spans on different
threads of one process that never overlapped, an asked-for overlap under 1%, or a GPU waiting on the host),
"pass" otherwise. A GPU trace (Kineto) gets analyze_gpu.py's reading first: time, idle explained, kernels,
overlap across streams; its spans breakdown is then the host's.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

import numpy as np

from infragent.analysis.breakdown import breakdown
from infragent.analysis.critical_path import critical_path
from infragent.analysis.diff import diff
from infragent.analysis.idle import TrackIdle, idle, pair_words, recurring
from infragent.analysis.moe import describe, moe_balance
from infragent.analysis.kineto import NOT_WORK, category_mask
from infragent.analysis.overlap import matrix, never_overlapping, overlap
from infragent.analysis.self_time import self_time
from infragent.analysis.trace_columns import TraceColumns
from infragent.analysis.trace_load import load_columns
from infragent.probes.analyze_gpu import gpu_versus, read_gpu
from infragent.probes.analyze_ranks import analyze_ranks
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Evidence, Feedback, Measure
from infragent.trace_model import TraceFormatError

CRITICAL_PATH_MAX_EVENTS = 2_000_000


def analyze(trace: str | Path | TraceColumns, vs: str | Path | TraceColumns | None = None,
            overlaps: list[tuple[str, str]] | None = None, top: int = 10, metric: str = "wall") -> Feedback:
    """Analyze one trace (against a baseline when vs is given)."""
    if not isinstance(trace, TraceColumns) and Path(trace).is_dir():
        if vs is not None or overlaps:
            raise TraceFormatError(f"{trace}: --vs and --overlap take one trace file, not a folder of ranks")
        return analyze_ranks(trace)
    c = trace if isinstance(trace, TraceColumns) else load_columns(trace)
    numbers: dict[str, Measure] = {}
    details: dict = {"source": c.source, "events": len(c), "tracks": [c.track_label(i) for i in range(len(c.tracks))]}
    findings: list[str] = []
    signature = False
    gpu = read_gpu(c, top=top)
    host = _host_rows(c) if gpu is not None else None  # on a GPU trace, spans are the host's; kernels are below
    rows = breakdown(c, "name", top=top, mask=host)
    details["top_spans"] = [asdict(r) for r in rows]
    details["by_track"] = [asdict(r) for r in breakdown(c, "track")]
    details["by_phase"] = [asdict(r) for r in breakdown(c, "phase", mask=host)]
    if gpu is not None:
        numbers.update(gpu.numbers)
        findings.extend(gpu.findings)
        details["gpu"] = {**gpu.details, "hypotheses": gpu.hypotheses}
        signature |= gpu.signature
    if rows:
        findings.append(f"top {'host ' if gpu is not None else ''}span {rows[0].key!r} {rows[0].share:.0%} of "
                        f"{'host ' if gpu is not None else ''}busy time")
    own_time = self_time(c, mask=host)
    details["self_time"] = [asdict(s) for s in own_time]
    for s in own_time[:2]:
        children = ", ".join(repr(n) for n in s.children[:3]) + (", ..." if len(s.children) > 3 else "")
        findings.append(f"time in no child span: {s.span!r} holds {s.share:.0%} of {'host ' if gpu is not None else ''}"
                        f"busy time itself ({s.self_ns / max(s.inclusive_ns, 1):.0%} of its own time), outside "
                        f"its children {children}: code between them that no span names")
    balance = moe_balance(c)
    if balance is not None:
        details["moe"] = {**asdict(balance), "rank_imbalance": balance.rank_imbalance}
        if balance.rank_imbalance is not None:
            numbers["moe_rank_imbalance"] = Measure(round(balance.rank_imbalance, 3), "max/mean")
        if balance.exchange_share_of_prefill is not None:
            numbers["moe_exchange_share_of_prefill"] = Measure(round(100 * balance.exchange_share_of_prefill, 2), "%")
        findings.append(describe(balance))
    labels, share = matrix(c, "cat")
    details["overlap_matrix"] = {"labels": labels, "share": share.round(4).tolist()}
    for a, b in overlaps or []:
        o = overlap(c, a, b)
        numbers[f"overlap[{a} | {b}]"] = Measure(round(100 * o.share_of_a, 2), "% of A")
        executing = ""
        if o.executing_share_of_a is not None:
            numbers[f"executing_overlap[{a} | {b}]"] = Measure(round(100 * o.executing_share_of_a, 2), "% of A")
            executing = f", {o.executing_share_of_a:.1%} while A was on CPU"
        details.setdefault("overlaps", []).append(_overlap_dict(o))
        findings.append(f"{b} overlaps {o.share_of_a:.1%} of {a}{executing} "
                        f"({', '.join(o.a_threads)} vs {', '.join(o.b_threads)})"
                        + (": NEVER overlaps" if o.never else ""))
        signature |= o.never or (o.a_busy_ns > 0 and o.share_of_a < 0.01)
    never = never_overlapping(c)
    details["never_overlapping"] = [_overlap_dict(o) for o in never]
    for o in never[:3]:
        running = ("" if o.executing_overlap_ns is None else
                   f"; running at the same time {o.executing_overlap_ns / 1e6:.2f} ms, by thread CPU time")
        findings.append(f"NEVER OVERLAP: {o.a} and {o.b} (both busy {o.a_busy_ns / 1e6:.1f} / "
                        f"{o.b_busy_ns / 1e6:.1f} ms in the same stretch; open at the same time "
                        f"{o.overlap_ns / 1e6:.2f} ms of wall time{running})")
    signature |= bool(never)
    gaps = [t for t in idle(c) if t.kind == "thread"] if gpu is not None else idle(c)  # streams: gpu_idle's
    details["idle"] = [asdict(t) for t in gaps]
    if gaps and gaps[0].idle_share > 0.05:
        kinds = ", ".join(f"{k} {v / 1e6:.1f} ms" for k, v in gaps[0].by_kind.items())
        findings.append(f"most idle: {gaps[0].track} {gaps[0].idle_share:.0%} ({kinds}; the kinds are inferred "
                        "from what the other threads did in each gap, not measured)" + _recurring(gaps[0]))
    if len(c) <= CRITICAL_PATH_MAX_EVENTS:
        path = critical_path(c)
        details["critical_path"] = {"total_ns": path.total_ns, "wait_ns": path.wait_ns, "steps": len(path.rows),
                                    "by_name": dict(list(path.by_name.items())[:top]), "by_track": path.by_track,
                                    "used_flows": path.used_flows, "truncated": path.truncated}
        if path.by_name:
            name, ns = next(iter(path.by_name.items()))
            findings.append(f"critical path {path.total_ns / 1e6:.1f} ms, most in {name!r} ({ns / max(path.total_ns, 1):.0%})")
    if vs is not None:
        base = vs if isinstance(vs, TraceColumns) else load_columns(vs)
        d = diff(base, c, metric=metric, top=top)
        numbers["e2e_change_pct"] = Measure(round(100 * d.change, 2), "%")
        numbers["predicted_change_pct"] = Measure(round(100 * d.predicted_change, 2), "%")
        details["diff"] = {**asdict(d), "headline": d.headline()}
        findings.insert(0, d.headline() + f" (spans predict {d.predicted_change:+.1%}, measured {d.change:+.1%})")
        versus = gpu_versus(base, c) if gpu is not None else None
        if versus is not None:
            numbers.update(versus[0])
            findings.insert(0, versus[1])
    evidence = [save_json("analyze", details, "the full analysis (breakdown, overlap, idle, critical path, diff)")]
    if not isinstance(trace, TraceColumns):
        evidence.insert(0, Evidence.of(trace, "the analyzed trace"))
    return Feedback("analyze", "fail" if signature else "pass", "; ".join(findings) or "empty trace",
                    numbers=numbers, locality={"trace": c.source, "baseline": getattr(vs, "source", str(vs)) if vs else None},
                    evidence=evidence, next_probes=(gpu.next_probes if gpu else []) + _next(never, gaps),
                    details=details)


def _host_rows(c: TraceColumns) -> np.ndarray:
    """Events on host threads, without Kineto's GPU-side annotations."""
    threads = np.asarray([t.kind == "thread" for t in c.tracks] or [False])
    return threads[c.track] & ~category_mask(c, NOT_WORK) if len(c) else np.zeros(0, bool)


def _recurring(track: TrackIdle) -> str:
    """'; 78% of it between 'step' and the next 'step' (320 gaps, median 4.5 ms): code no span names, or a wait'
    when one pair of neighbouring spans holds most of a track's idle time in recurring gaps, else ''."""
    top = recurring(track)
    if top is None:
        return ""
    return (f"; {top.idle_ns / track.idle_ns:.0%} of it {pair_words(top.before, top.after)} ({top.gaps} gaps, "
            f"median {top.median_ns / 1e6:.3g} ms): code that no span names, or a wait, between those two")


def _overlap_dict(o) -> dict:  # noqa: ANN001
    return {**asdict(o), "share_of_a": o.share_of_a, "executing_share_of_a": o.executing_share_of_a, "never": o.never}


def _next(never: list, gaps: list) -> list[str]:
    probes = []
    if never:
        probes.append("infragent gil (inferred from spans that never overlap: is one thread starved of the GIL "
                      "while the other runs? gil measures it)")
    if any("gil" in t.by_kind for t in gaps):
        probes.append("infragent gil on the thread with GIL gaps")
    return probes
