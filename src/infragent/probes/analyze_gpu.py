"""The GPU part of `analyze`: what a Kineto trace says about the GPU, as numbers, findings in plain words, and
hypotheses that follow from the evidence (launch-bound → CUDA graphs, larger batches, fusion, fewer syncs;
GPU-bound → the top kernels; copies in the open → move them under computation)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field

from infragent.analysis.gpu_idle import DeviceIdle, gpu_idle
from infragent.analysis.gpu_overlap import StepGpu, comm_comp_overlap, device_overlaps, step_gpu
from infragent.analysis.gpu_steps import steps
from infragent.analysis.gpu_time import device_breakdowns, temporal_breakdown
from infragent.analysis.kernels import kernel_table
from infragent.analysis.kineto import device_work, launches
from infragent.analysis.trace_columns import TraceColumns
from infragent.probes.feedback import Measure

HOST_BOUND_IDLE = 0.5  # the GPU idles at least half its window ...
HOST_BOUND_SHARE = 0.5  # ... and the host caused at least half of that idle time
SYNC_SHARE = 0.2  # sync calls behind this much of the host-caused idle: the syncs are a hypothesis of their own
COPY_WORTH = 0.01  # copies (memsets included) under 1% of the GPU window are not worth a word
HOT_OP = 0.3  # one host op holding the host this much of the host-caused idle: a hypothesis of its own
QUEUED = 10  # a launch→start lag this many times the host's time between launches: the host runs ahead


@dataclass
class GpuReading:
    """The GPU part of an analysis: numbers, findings, details, hypotheses, next probes, and whether it is a
    signature worth acting on (the GPU waiting on the host)."""

    numbers: dict[str, Measure] = field(default_factory=dict)
    findings: list[str] = field(default_factory=list)
    details: dict = field(default_factory=dict)
    hypotheses: list[dict] = field(default_factory=list)
    next_probes: list[str] = field(default_factory=list)
    signature: bool = False


def read_gpu(c: TraceColumns, top: int = 10) -> GpuReading | None:
    """The GPU reading of a trace with GPU work; None when it has none."""
    work = device_work(c)
    if not work.any():
        return None
    r = GpuReading()
    launched = launches(c, work)
    parts = device_breakdowns(c)
    total = temporal_breakdown(c)
    for part in ("compute", "non_compute", "idle"):
        r.numbers[f"gpu_{part}_pct"] = Measure(round(total.pct(part), 2), "%")
    if len(parts) > 1:
        for p in parts:
            r.numbers[f"gpu{p.device}_idle_pct"] = Measure(round(p.pct("idle"), 2), "%")
    r.numbers["comm_comp_overlap_pct"] = Measure(round(comm_comp_overlap(c), 2), "%")
    idle = gpu_idle(c, launched)
    kernels = kernel_table(c, work, top=top)
    overlaps = device_overlaps(c)
    per_step = step_gpu(c, steps(c, work, launched), launched)
    r.details = {"devices": [asdict(p) | {"idle_pct": p.pct("idle"), "compute_pct": p.pct("compute"),
                                          "non_compute_pct": p.pct("non_compute")} for p in parts],
                 "idle": [asdict(d) for d in idle], "kernels": asdict(kernels),
                 "overlap": [asdict(o) | {"copy_overlap_share": o.copy_overlap_share} for o in overlaps],
                 "steps": [asdict(s) | {"idle_share": s.idle_share, "copy_overlap_share": s.copy_overlap_share}
                           for s in per_step]}
    for d in idle:
        _read_idle(r, d, len(idle) > 1)
    _read_modes(r, per_step)
    if kernels.kinds:
        kinds = ", ".join(f"{k.kind} {k.share:.0%}" for k in kernels.kinds[:3])
        first = kernels.top[0]
        r.findings.append(f"GPU work time: {kinds}; top {first.short} ({first.source}) {first.share:.0%}, "
                          f"{first.count} calls, median {first.median_ns / 1e3:.1f} µs")
    for o, p in zip(overlaps, parts):
        _read_overlap(r, o, per_step, p.kernel_ns)
    if total.kernel_ns and total.pct("idle") < 100 * (1 - HOST_BOUND_IDLE) and kernels.top:
        first = kernels.top[0]
        r.next_probes.append(f"infragent roofline on the op behind the top kernel ({first.short}, {first.share:.0%} "
                             "of kernel time): is it at the GPU's compute or memory roof?")
    r.signature = any(h["kind"] == "host-bound" for h in r.hypotheses)
    return r


def _read_idle(r: GpuReading, d: DeviceIdle, several: bool) -> None:
    where = f"GPU {d.device} " if several else "GPU "
    lag = d.launch
    host = d.cause_share("host")
    parts = {k: v / max(sum(d.host_parts.values()), 1) for k, v in d.host_parts.items()}
    pre = f"gpu{d.device}_" if several else ""
    r.numbers[f"{pre or 'gpu_'}idle_on_host_pct"] = Measure(round(100 * host, 1), "% of idle")
    if lag and lag.median_lag_ns is not None:
        r.numbers[f"{pre}launch_lag_median_us"] = Measure(round(lag.median_lag_ns / 1e3, 2), "µs")
    if lag and lag.median_kernel_ns is not None:
        r.numbers[f"{pre}kernel_median_us"] = Measure(round(lag.median_kernel_ns / 1e3, 2), "µs")
    timing = _launch_words(lag)
    if d.idle_share >= HOST_BOUND_IDLE and host >= HOST_BOUND_SHARE:
        split = ", ".join(f"{k} {v:.0%}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= 0.005)
        hot = _hot_ops(d)
        held = f"; its own time there most in {hot}" if hot else ""
        r.findings.insert(0, f"{where}idle {d.idle_share:.1%} of the window ({d.idle_ns / 1e6:.1f} of "
                             f"{d.window_ns / 1e6:.1f} ms): waiting on the host ({host:.0%} of the idle time; the host "
                             f"was in {split}{held}); {timing}")
        _launch_bound_hypotheses(r, d, parts)
    elif d.idle_ns:
        causes = ", ".join(f"{k} {d.cause_share(k):.0%}" for k in ("host", "another stream", "other")
                           if d.cause_share(k) >= 0.005)
        r.findings.append(f"{where}idle {d.idle_share:.1%} of the window ({causes} of it); {timing}")
    for s in d.streams:
        dep = s.by_cause.get("another stream", 0)
        if s.idle_ns and dep >= 0.2 * s.idle_ns:
            r.findings.append(f"{s.stream} waits on another stream {dep / s.idle_ns:.0%} of its idle time "
                              f"({dep / 1e6:.1f} ms): a cross-stream dependency")


def _hot_ops(d: DeviceIdle) -> str:
    """The host ops that held the thread most of the host-caused idle time ('' when none stands out)."""
    host_ns = max(d.by_cause.get("host", 0), 1)
    named = [f"{op} {ns / host_ns:.0%}" for op, ns in d.host_ops[:2] if ns >= 0.1 * host_ns]
    return ", ".join(named)


def _launch_words(lag) -> str:  # noqa: ANN001
    if lag is None or lag.median_lag_ns is None:
        return "no launch calls correlated"
    words = f"median launch→start lag {lag.median_lag_ns / 1e3:.1f} µs"
    if lag.median_host_interval_ns and lag.median_lag_ns > QUEUED * lag.median_host_interval_ns:
        words += " (work queues up: the host runs ahead of the GPU)"
    if lag.median_kernel_ns is not None:
        words += f", kernels median {lag.median_kernel_ns / 1e3:.1f} µs"
    if lag.median_host_interval_ns is not None:
        words += f", {lag.median_host_interval_ns / 1e3:.1f} µs of host time between launches"
    if lag.graph:
        words += f"; {lag.graph} of {lag.work} pieces of work ran in {lag.graph_launches} CUDA-graph replays"
    return words


def _launch_bound_hypotheses(r: GpuReading, d: DeviceIdle, parts: dict[str, float]) -> None:
    lag = d.launch
    saved = d.by_cause.get("host", 0) / d.window_ns if d.window_ns else 0.0
    bound = f"at most {saved:.0%} shorter GPU time (the host-caused idle)"
    evidence = [f"GPU {d.device} idle {d.idle_share:.1%}, {d.cause_share('host'):.0%} of it waiting on the host"]
    eager = lag is not None and lag.eager >= lag.graph

    def pose(remedy: str, claim: str, words: list[str]) -> None:
        r.hypotheses.append({"kind": "host-bound", "remedy": remedy, "claim": claim, "probe": "record",
                             "predicted": bound, "evidence": evidence, "knob_words": words})

    host_ns = max(d.by_cause.get("host", 0), 1)
    if d.host_ops and d.host_ops[0][1] >= HOT_OP * host_ns:
        op, ns = d.host_ops[0]
        pose("a cheaper host op", f"{op} holds the host {ns / host_ns:.0%} of the time the GPU waits on it "
             f"({ns / 1e6:.1f} ms): make that op cheaper on the host (cache what it sets up, another backend or "
             "shape handling, or capture it in a CUDA graph)", [w for w in re.split(r"[^a-z0-9]+", op.lower())
                                                               if len(w) >= 4 and w not in ("aten", "forward")])
    if eager:
        pose("CUDA graphs", f"launch-bound: {lag.eager} eagerly launched kernels leave the GPU idle between them; "
             "capture the step as a CUDA graph and replay it", ["cuda_graph", "enforce_eager", "graph", "compile"])
    work, host = (lag.median_work_per_launch_ns, lag.median_host_interval_ns) if lag else (None, None)
    if work is not None and host and work < host:
        pose("larger batches", f"each launch gives the GPU {work / 1e3:.1f} µs of work (median) for {host / 1e3:.1f} µs "
             "of host time: larger batches give each launch more work", ["batch", "max_num_seqs",
                                                                           "max_num_batched_tokens"])
    if eager:
        pose("fusion", "fewer, larger kernels (fusion: torch.compile or fused ops) cut launches per step",
             ["compile", "fuse", "fusion"])
    else:
        pose("overlap the host", "the steps already replay CUDA graphs, yet the GPU waits for the host between "
             "them: prepare the next step on the host while the GPU runs this one (asynchronous scheduling)",
             ["async", "schedul", "overlap"])
    drained = d.after_sync_ns / max(d.by_cause.get("host", 0), 1)
    if parts.get("sync", 0) >= SYNC_SHARE or drained >= SYNC_SHARE:
        pose("fewer syncs", f"{drained:.0%} of the host-caused idle time follows a sync call (the host waited for "
             "the GPU to drain, then had to refill it): remove host syncs (.item(), .cpu(), synchronize) from the "
             "step or move them off its path", ["sync"])
    r.next_probes.append("infragent analyze TRACE_AFTER --vs THIS_TRACE (trace the step again with "
                         + " or ".join(h["remedy"] for h in r.hypotheses if h["kind"] == "host-bound")
                         + "; GPU idle must fall)")


def _read_modes(r: GpuReading, per_step: list[StepGpu]) -> None:
    modes = {m: [s for s in per_step if s.mode == m] for m in ("eager", "graph")}
    if not (modes["eager"] and modes["graph"]):
        return
    def idle(group: list[StepGpu]) -> float:
        return 1 - sum(s.busy_ns for s in group) / max(sum(s.window_ns for s in group), 1)
    r.numbers["eager_step_gpu_idle_pct"] = Measure(round(100 * idle(modes["eager"]), 1), "%")
    r.numbers["graph_step_gpu_idle_pct"] = Measure(round(100 * idle(modes["graph"]), 1), "%")
    r.findings.append(f"eager steps: GPU idle {idle(modes['eager']):.0%} of their GPU time ({len(modes['eager'])} steps);"
                      f" CUDA-graph replays: {idle(modes['graph']):.0%} ({len(modes['graph'])} steps)")


def _read_overlap(r: GpuReading, o, per_step: list[StepGpu], window_ns: int) -> None:  # noqa: ANN001
    if o.copy_ns >= COPY_WORTH * window_ns:
        r.numbers["copy_under_compute_pct"] = Measure(round(100 * o.copy_overlap_share, 1), "% of copy time")
        with_copy = [s for s in per_step if s.copy_ns >= 0.01 * o.copy_ns]
        if with_copy:
            by_step = ", ".join(f"{s.index}: {s.copy_overlap_share:.0%}" for s in with_copy)
            r.findings.append(f"copies under computation {o.copy_overlap_share:.0%} of {o.copy_ns / 1e6:.1f} ms of copy "
                              f"time; by step ({with_copy[0].name}) {by_step}")
        else:
            r.findings.append(f"copies under computation {o.copy_overlap_share:.0%} of {o.copy_ns / 1e6:.1f} ms")
        exposed = [s for s in with_copy if (s.copy_overlap_share or 0) < 0.05]
        if exposed and o.copy_ns >= 0.05 * sum(s.window_ns for s in per_step or []):
            r.hypotheses.append({"kind": "copy-exposed", "remedy": "overlap the copy",
                                 "claim": f"the copies of steps {', '.join(str(s.index) for s in exposed)} run with no "
                                          "computation beside them: issue them on a side stream from pinned memory "
                                          "ahead of use",
                                 "probe": "record", "predicted": "up to their copy time off each step",
                                 "evidence": [f"copy under computation {o.copy_overlap_share:.0%} overall"],
                                 "knob_words": ["copy", "prefetch", "pin"]})
    if o.streams > 1 and o.compute_concurrent_ns:
        r.findings.append(f"computation on two or more streams at once {o.compute_concurrent_ns / 1e6:.2f} ms "
                          f"({o.compute_concurrent_ns / max(o.compute_ns, 1):.0%} of compute time)")
    if o.comm_ns:
        r.findings.append(f"communication under computation {o.comm_overlap_share:.0%} of {o.comm_ns / 1e6:.1f} ms")


def gpu_versus(base: TraceColumns, cand: TraceColumns) -> tuple[dict[str, Measure], str] | None:
    """The GPU of a candidate trace against a baseline's: idle share and GPU time per step (or per window)."""
    if not (device_work(base).any() and device_work(cand).any()):
        return None
    b, c = temporal_breakdown(base), temporal_breakdown(cand)
    per_b, per_c = _per_step_ns(base, b), _per_step_ns(cand, c)
    unit = "step" if per_b[1] and per_c[1] else "window"
    change = per_c[0] / per_b[0] - 1 if per_b[0] else 0.0
    numbers = {"gpu_idle_pct_baseline": Measure(round(b.pct("idle"), 2), "%"),
               f"gpu_time_per_{unit}_change_pct": Measure(round(100 * change, 2), "%")}
    return numbers, (f"GPU against the baseline: idle {b.pct('idle'):.1f}% → {c.pct('idle'):.1f}%, GPU time per {unit} "
                     f"{per_b[0] / 1e6:.3f} → {per_c[0] / 1e6:.3f} ms ({change:+.1%})")


def _per_step_ns(c: TraceColumns, tb) -> tuple[float, int]:  # noqa: ANN001
    """GPU window per step (the whole window when the trace has no steps), and the number of steps."""
    work = device_work(c)
    launched = launches(c, work)
    found = [s for s in step_gpu(c, steps(c, work, launched), launched) if s.work]
    if found:
        return sum(s.window_ns for s in found) / len(found), len(found)
    return float(tb.kernel_ns), 0
