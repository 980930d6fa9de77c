"""The roofline probe: count a call's FLOPs and bytes, time it, and say what bounds it and how close it gets.

Classification rule (RULE below): the call needs at least
    t_compute  = FLOPs / compute roof,
    t_memory   = bytes / memory roof,
    t_overhead = torch ops dispatched x per-op floor (measured wall time of one tiny op called from Python);
the largest of the three is what bounds it (compute vs memory is the usual intensity-vs-ridge test), and
pct_of_peak = that time / measured time (achieved GFLOP/s / peak, achieved GB/s / roof, or floor / time).
The roofs are the device's the inputs live on: on the CPU (machine.py) the fp32 matmul peak, the faster of copy
and GEMV-stream bandwidth and the per-op floor; on a GPU (gpu_peaks.py) the matmul peak of the inputs' dtype
(bf16/fp16 tensor-core, fp32 in TF32 when allowed, else fp32), HBM copy bandwidth and the launch floor.
"""
from __future__ import annotations

import gc
import inspect
import os
import time
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch

from infragent.probes.redundancy import describe, extra_work
from infragent.probes.time_gap import TimeGap, time_gap
from infragent.probes.time_gap import describe as describe_gap
from infragent.probes.work import WorkCount, count_work, work_of
from infragent.analysis.stats import Summary, bootstrap_median, min_detectable_effect
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.inputs import Case, InputsFactory, call, draw, tensors_of
from infragent.probes.gpu_peaks import gpu_peaks, tf32_allowed
from infragent.probes.machine import CONTENDED_CORES, CpuWatch, HasRoofs, Roofs, machine_peaks

RULE = ("bound = the largest of t_compute = FLOPs / compute roof (the matmul peak of the inputs' device and dtype), "
        "t_memory = bytes / memory roof and t_overhead = torch ops x per-op floor; "
        "pct_of_peak = that time / measured time")
MIN_SAMPLES = 5  # fewer timing samples than this (a call slower than the budget allows) is inconclusive
BYTES_NOTE = ("bytes are a lower bound (inputs read once, outputs and mutated inputs written once) unless a "
              "formula gives them; op_bytes is the upper bound where every op's operands go through memory")


@dataclass
class Classification:
    """What bounds a call and how close the call gets to that roof."""

    bound: str  # compute-bound | memory-bound | overhead-bound
    roof: str  # name of the binding roof
    pct_of_peak: float  # fraction (1.0 = at the roof)
    t_compute_s: float
    t_memory_s: float
    t_overhead_s: float
    intensity: float  # FLOP per byte
    ridge: float  # FLOP per byte where the compute and memory roofs meet


@dataclass
class RooflineResult:
    """Everything roofline measured about one call, before rendering."""

    name: str
    shapes: str
    work: WorkCount
    time: Summary  # seconds per call
    peaks: HasRoofs  # Peaks (CPU) or GpuPeaks
    roofs: Roofs  # the peaks' roofs for this call's dtype
    classification: Classification
    threads: int
    loops: int  # calls per timing sample
    useful_flops: float | None = None
    reference_work: WorkCount | None = None
    reference_ops: WorkCount | None = None  # the reference counted op by op (its formula has no per-op split)
    others_cores: float | None = None  # CPU, in cores, other processes used while fn was timed
    device: str = "cpu"  # where the inputs live
    dtype: str = ""  # the inputs' compute dtype (what picks a GPU's compute roof)
    reference_time: Summary | None = None  # the reference's seconds per call, timed on the same case

    @property
    def gap(self) -> TimeGap | None:
        """The time gap beyond the FLOP ratio (None without a timed, counted reference)."""
        ops = self.reference_ops or self.reference_work
        if self.reference_time is None or ops is None or self.reference_work is None:
            return None
        return time_gap(self.work, replace(ops, flops=self.reference_work.flops), self.time.median,
                        self.reference_time.median, self.roofs.op_floor_s)

    @property
    def redundant_flop_fraction(self) -> float | None:
        """1 - useful/actual FLOPs, when the useful work is known."""
        if self.useful_flops is None or self.work.flops <= 0:
            return None
        return 1.0 - self.useful_flops / self.work.flops


def clone_case(case: Case) -> Case:
    """A copy of the case whose tensors are fresh clones (so a counting run cannot disturb the timed inputs)."""
    def clone(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return value.clone()
        if isinstance(value, dict):
            return {k: clone(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(clone(v) for v in value)
        return value
    return Case(clone(case.args), clone(case.kwargs), case.label, case.reduction)


def case_device(case: Case) -> torch.device:
    """The CUDA device the case's tensors are on, if any is; else the CPU."""
    for t in tensors_of((case.args, case.kwargs)):
        if t.device.type == "cuda":
            return t.device
    return torch.device("cpu")


def compute_dtype(case: Case) -> torch.dtype | None:
    """The floating dtype holding most of the case's tensor elements (None when no tensor is floating)."""
    counts: dict[torch.dtype, int] = {}
    for t in tensors_of((case.args, case.kwargs)):
        if t.is_floating_point():
            counts[t.dtype] = counts.get(t.dtype, 0) + t.numel()
    return max(counts, key=counts.__getitem__) if counts else None


def _synchronizer(device: torch.device) -> Callable[[], None]:
    """What waits for the device's queued work: torch.cuda.synchronize on CUDA, nothing on the CPU."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def time_call(fn: Callable[..., Any], case: Case, budget_s: float = 1.0, min_samples: int = MIN_SAMPLES,
              max_samples: int = 30, sample_s: float = 2e-3) -> tuple[Summary, int]:
    """Median seconds per call with a bootstrap CI; each sample loops enough calls to last about sample_s.

    On CUDA inputs every sample ends with a synchronize, so it holds the kernels' time, not only their launch."""
    sync = _synchronizer(case_device(case))
    call(fn, case)  # warm-up
    sync()
    loops = 1
    while True:
        start = time.perf_counter()
        for _ in range(loops):
            call(fn, case)
        sync()
        elapsed = time.perf_counter() - start
        if elapsed >= sample_s or loops >= 1 << 20:
            break
        loops *= 2 if elapsed * 8 >= sample_s else 8
    samples: list[float] = []
    began = time.perf_counter()
    enabled = gc.isenabled()
    gc.disable()
    try:
        while len(samples) < max_samples:
            start = time.perf_counter()
            for _ in range(loops):
                call(fn, case)
            sync()
            samples.append((time.perf_counter() - start) / loops)
            spent = time.perf_counter() - began
            next_ends = spent + samples[-1] * loops  # stop before a sample that would end past twice the budget
            if (len(samples) >= min_samples and spent >= budget_s) or next_ends > 2 * budget_s:
                break
    finally:
        if enabled:
            gc.enable()
    return bootstrap_median(samples, resamples=2000), loops


def classify(work: WorkCount, seconds: float, peaks: HasRoofs | Roofs, dtype: torch.dtype | None = None,
             tf32: bool = False) -> Classification:
    """Apply RULE to a call's counts, its measured seconds per call and the roofs (or peaks, for dtype and tf32)."""
    roofs = peaks if isinstance(peaks, Roofs) else peaks.roofs(dtype, tf32)
    times = {
        "compute-bound": (work.flops / roofs.compute_flops_per_s, roofs.compute_name),
        "memory-bound": (work.bytes / roofs.memory_bytes_per_s, roofs.memory_name),
        "overhead-bound": (work.ops * roofs.op_floor_s, roofs.floor_name),
    }
    bound = max(times, key=lambda b: times[b][0])
    t_bound, roof = times[bound]
    return Classification(
        bound=bound, roof=roof, pct_of_peak=t_bound / seconds if seconds > 0 else float("nan"),
        t_compute_s=times["compute-bound"][0], t_memory_s=times["memory-bound"][0],
        t_overhead_s=times["overhead-bound"][0],
        intensity=work.flops / work.bytes if work.bytes > 0 else float("inf"), ridge=roofs.ridge_flop_per_byte)


def _describe(fn: Callable[..., Any], case: Case) -> str:
    """'q[1,16,128] k[...] ...' for the tensor arguments (named when fn's signature allows)."""
    try:
        names = list(inspect.signature(fn).bind(*case.args, **case.kwargs).arguments.items())
    except (TypeError, ValueError):
        names = [(f"arg{i}", a) for i, a in enumerate(case.args)] + list(case.kwargs.items())
    parts = []
    for name, value in names:
        if isinstance(value, torch.Tensor):
            dtype = "" if value.dtype == torch.float32 else f":{str(value.dtype).replace('torch.', '')}"
            parts.append(f"{name}[{','.join(map(str, value.shape))}]{dtype}")
    return " ".join(parts)


def _name(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def measure_roofline(fn: Callable[..., Any], factory: InputsFactory, reference: Callable[..., Any] | None = None, *,
                     flops: float | None = None, bytes_moved: float | None = None,
                     useful_flops: float | None = None, peaks: HasRoofs | None = None, threads: int | None = None,
                     budget_s: float = 1.0, quick_peaks: bool = False, remeasure: bool = False,
                     seed: int = 0) -> RooflineResult:
    """Count, time and classify fn on one drawn case; the data behind run_roofline's Feedback.

    Inputs on a CUDA device are judged against that GPU's peaks (gpu_peaks), else against the CPU's."""
    before = torch.get_num_threads()
    threads = threads or before
    torch.set_num_threads(threads)
    try:
        case = draw(factory, 0, seed)
        device = case_device(case)
        if peaks is None:
            peaks = (gpu_peaks(device, remeasure=remeasure) if device.type == "cuda"
                     else machine_peaks(threads, quick=quick_peaks, remeasure=remeasure))
        dtype = compute_dtype(case)
        roofs = peaks.roofs(dtype, device.type == "cuda" and tf32_allowed())
        work = work_of(fn, clone_case(case))
        if flops is not None or bytes_moved is not None:
            work = WorkCount(flops=work.flops if flops is None else float(flops),
                             bytes=work.bytes if bytes_moved is None else float(bytes_moved), source="given",
                             ops=work.ops, op_bytes=work.op_bytes, parts=work.parts, uncounted_ops=work.uncounted_ops)
        reference_work = work_of(reference, clone_case(case)) if reference is not None else None
        if useful_flops is None and reference_work is not None:
            useful_flops = reference_work.flops
        reference_ops = reference_work
        if reference_work is not None and not reference_work.by_op and work.by_op:  # where the extra work is
            reference_ops = count_work(reference, clone_case(case))
        watch = CpuWatch()
        summary, loops = time_call(fn, case, budget_s)
        others = watch.others_cores()
        reference_time = time_call(reference, clone_case(case), budget_s / 2)[0] if reference is not None else None
    finally:
        torch.set_num_threads(before)
    return RooflineResult(name=_name(fn), shapes=_describe(fn, case), work=work, time=summary, peaks=peaks,
                          roofs=roofs, classification=classify(work, summary.median, roofs), threads=threads,
                          loops=loops, useful_flops=useful_flops, reference_work=reference_work, others_cores=others,
                          reference_ops=reference_ops, device=str(device), reference_time=reference_time,
                          dtype=str(dtype).removeprefix("torch.") if dtype else "")


def _g(x: float) -> str:
    return f"{x:.3g}"


def _rate(achieved: float, roof: float, unit: str) -> str:
    """'5.3 GB/s of 13.4' (tera- once the roof reaches 1e12, else giga-)."""
    scale, prefix = (1e12, "T") if roof >= 1e12 else (1e9, "G")
    return f"{_g(achieved / scale)} {prefix}{unit} of {_g(roof / scale)}"


def _headline(r: RooflineResult) -> str:
    """'memory-bound: 41% of copy bandwidth (5.3 GB/s of 13.4)' style first clause."""
    c, t, roofs = r.classification, r.time.median, r.roofs
    if c.bound == "compute-bound":
        got, of = _rate(r.work.flops / t, roofs.compute_flops_per_s, "FLOP/s"), ""
    elif c.bound == "memory-bound":
        got, of = _rate(r.work.bytes / t, roofs.memory_bytes_per_s, "B/s"), ""
    else:
        got = (f"{r.work.ops} torch ops x {_g(roofs.op_floor_s * 1e6)} µs = {_g(c.t_overhead_s * 1e6)} µs "
               f"of {_g(t * 1e6)} µs per call")
        of = f"; compute {c.t_compute_s / t:.1%}, memory {c.t_memory_s / t:.1%} of their roofs"
    text = f"{c.bound}: {c.pct_of_peak:.0%} of {c.roof} ({got}){of}"
    if c.pct_of_peak > 1.05 and c.bound == "memory-bound":
        text += " (above the memory roof: the working set is likely cache-resident)"
    elif c.pct_of_peak > 1.05 and c.bound == "compute-bound":
        text += " (above the measured peak: re-measure the peaks with INFRAGENT_REMEASURE=1 on a quiet machine"
        text += ", or the call computes in a narrower dtype than its inputs)" if r.device != "cpu" else ")"
    return text


def _finding(r: RooflineResult, noisy: bool, rel: float) -> str:
    text = _headline(r)
    red = r.redundant_flop_fraction
    if red is not None:
        text += (f"; {red:.1%} of FLOPs redundant ({_g(r.useful_flops)} useful of {_g(r.work.flops)})" if red > 0
                 else f"; no redundant FLOPs (useful {_g(r.useful_flops)} >= actual {_g(r.work.flops)})")
    if (gap := r.gap) is not None and gap.wide:  # before the redundancy's detail: a compact reply clips the end
        text += f"; {describe_gap(gap)}"
    if red is not None and red > 0 and r.reference_ops is not None and r.reference_ops.by_op and r.work.by_op:
        where = describe(extra_work(r.work, r.reference_ops), r.work.flops)
        text += f"; where the redundant FLOPs are: {where}" if where else ""
    if r.others_cores is not None and r.others_cores > CONTENDED_CORES:
        text += f" [contended: other processes used {r.others_cores:.1f} of {os.cpu_count()} cores while timing]"
    if noisy:
        why = f"±{rel:.0%} of the median" if r.time.n >= MIN_SAMPLES else f"only {r.time.n} samples"
        text = f"timing too noisy ({why}) for a firm call; tentatively {text}"
    return text


def _next_probes(r: RooflineResult, noisy: bool = False) -> list[str]:
    c, out = r.classification, []
    if noisy:
        out.append("rerun on a quieter machine (or with fewer torch threads) or with a larger budget_s")
    red = r.redundant_flop_fraction
    if red is not None and red > 0.05:
        out.append("find the padded or recomputed work: compare the kernel's shapes and per-tile math with the reference")
    if (gap := r.gap) is not None and gap.wide and (gap.syncs > gap.reference_syncs or gap.ops > 2 * gap.reference_ops):
        out.append("take the host syncs (.item(), .cpu()) out of the loop and do the chunks in one batched op; "
                   "`infragent record` shows the per-op time")
    if c.bound == "overhead-bound":
        out.append("more work per call (batch) or fewer torch ops (fuse); `infragent record` shows per-op time")
    elif c.bound == "memory-bound" and r.work.op_bytes > 2 * r.work.bytes:
        out.append(f"intermediates move {r.work.op_bytes / r.work.bytes:.1f}x the compulsory bytes: fuse ops")
    elif c.pct_of_peak < 0.5:
        out.append("far below the roof: `infragent bench` alternative kernels or layouts against this one")
    return out


def to_feedback(r: RooflineResult, max_rel_ci: float = 0.2) -> Feedback:
    """Render a RooflineResult as the probe's Feedback.

    Inconclusive when the time CI's half-width exceeds max_rel_ci of the median or fewer than MIN_SAMPLES
    timing samples fit in three times the budget.
    """
    t, c = r.time, r.classification
    rel = min_detectable_effect(t)
    noisy = not (rel <= max_rel_ci) or t.n < MIN_SAMPLES

    def per_s(amount: float, scale: float, unit: str) -> Measure:
        return Measure(amount / t.median / scale, unit, amount / t.hi / scale, amount / t.lo / scale, t.n)

    t_bound = max(c.t_compute_s, c.t_memory_s, c.t_overhead_s)
    numbers = {
        "time_us": Measure(t.median * 1e6, "µs", t.lo * 1e6, t.hi * 1e6, t.n),
        "gflops": per_s(r.work.flops, 1e9, "GFLOP/s"),
        "gbps": per_s(r.work.bytes, 1e9, "GB/s"),
        "intensity_flop_per_byte": Measure(c.intensity, "FLOP/B"),
        "ridge_flop_per_byte": Measure(c.ridge, "FLOP/B"),
        "pct_of_peak": per_s(t_bound * 100, 1, "%"),
        "flops": Measure(r.work.flops, "FLOP"),
        "bytes": Measure(r.work.bytes, "B"),
    }
    if r.redundant_flop_fraction is not None:
        numbers["redundant_flop_fraction"] = Measure(r.redundant_flop_fraction)
    details: dict[str, Any] = {
        "classification_rule": RULE, "bytes_note": BYTES_NOTE, "bound": c.bound, "roof": c.roof,
        "roof_times_us": {"compute": c.t_compute_s * 1e6, "memory": c.t_memory_s * 1e6,
                          "overhead": c.t_overhead_s * 1e6},
        "overhead_share": min(1.0, c.t_overhead_s / t.median) if t.median > 0 else None,
        "peaks": {**r.peaks.to_dict(), "memory_roof_bytes_per_s": r.roofs.memory_bytes_per_s},
        "roofs": asdict(r.roofs), "device": r.device, "dtype": r.dtype,
        "counts": asdict(r.work), "threads": r.threads, "loops_per_sample": r.loops,
        "others_cores_while_timing": r.others_cores,
    }
    if (gap := r.gap) is not None:
        details["time_gap"] = {**asdict(gap), "wide": gap.wide, "op_overhead_s": gap.op_overhead_s}
        numbers["time_ratio_vs_reference"] = Measure(gap.time_ratio, "x")
        numbers["flop_ratio_vs_reference"] = Measure(gap.flop_ratio, "x")
    if r.reference_work is not None:
        details["reference_counts"] = asdict(r.reference_work)
        ops = r.reference_ops or r.reference_work
        rows = extra_work(r.work, ops) if ops.by_op and r.work.by_op else []
        details["extra_work"] = [{**asdict(row), "repeat": row.repeat, "extra_flops": row.extra_flops,
                                  "padding_flops": row.padding_flops, "recompute_flops": row.recompute_flops}
                                 for row in rows]
        padded = [row for row in rows if row.padding_flops > 0]
        if padded:
            numbers["padding_flop_fraction"] = Measure(sum(row.padding_flops for row in padded) / r.work.flops)
            details["padded_dimensions"] = list(dict.fromkeys(row.grown for row in padded))
        recomputed = [row for row in rows if row.kind == "recomputed"]
        if recomputed:
            numbers["recompute_factor"] = Measure(max(row.repeat / row.padding for row in recomputed), "x per call")
            numbers["recomputed_flop_fraction"] = Measure(sum(row.recompute_flops for row in recomputed) / r.work.flops)
    locality = {"function": r.name, "shapes": r.shapes}
    if details.get("padded_dimensions"):
        locality["padded_dimension"] = ", ".join(details["padded_dimensions"])
    return Feedback(probe="roofline", verdict="inconclusive" if noisy else "pass", finding=_finding(r, noisy, rel),
                    numbers=numbers, locality=locality,
                    next_probes=_next_probes(r, noisy),
                    details=details)


def run_roofline(fn: Callable[..., Any], factory: InputsFactory, reference: Callable[..., Any] | None = None, *,
                 flops: float | None = None, bytes_moved: float | None = None, useful_flops: float | None = None,
                 peaks: HasRoofs | None = None, threads: int | None = None, budget_s: float = 1.0,
                 quick_peaks: bool = False, remeasure: bool = False, seed: int = 0,
                 max_rel_ci: float = 0.2) -> Feedback:
    """Roofline a call: counts, timing, bound and % of peak, and redundant FLOPs vs a reference (or useful_flops)."""
    result = measure_roofline(fn, factory, reference, flops=flops, bytes_moved=bytes_moved, useful_flops=useful_flops,
                              peaks=peaks, threads=threads, budget_s=budget_s, quick_peaks=quick_peaks,
                              remeasure=remeasure, seed=seed)
    return to_feedback(result, max_rel_ci)
