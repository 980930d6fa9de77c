"""analyze on a folder of per-rank traces (one Kineto file per rank, as torch.profiler writes them in a
distributed run and HTA reads them): each rank's GPU reading side by side, and the straggler. In a collective
every rank waits inside its communication kernels until the last one arrives, so the rank with the least
communication time is the one the others wait for; its own busy time is where the step's time goes."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from infragent.analysis.gpu_overlap import device_overlaps
from infragent.analysis.gpu_time import temporal_breakdown
from infragent.analysis.trace_columns import TraceColumns
from infragent.analysis.trace_load import load_columns
from infragent.probes.analyze_gpu import read_gpu
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Evidence, Feedback, Measure
from infragent.trace_model import TraceFormatError

TRACE_FILE = re.compile(r"\.json(\.gz)?$")
STRAGGLER_GAP = 0.2  # the least communication time below this share of the median: the others wait for that rank


@dataclass
class RankReading:
    """One rank's GPU in a few numbers."""

    rank: int
    source: str
    idle_pct: float
    compute_pct: float
    non_compute_pct: float
    comm_ns: int
    window_ns: int
    host_bound: bool


def rank_files(folder: Path) -> list[Path]:
    """The trace files of a folder, one per rank."""
    files = sorted(p for p in folder.iterdir() if p.is_file() and TRACE_FILE.search(p.name) and _looks_like_trace(p))
    if not files:
        raise TraceFormatError(f"{folder}: no trace files (*.json or *.json.gz) in this folder; give a trace file, "
                               "or a folder holding one trace per rank")
    return files


def _looks_like_trace(path: Path) -> bool:
    """A Chrome/Kineto trace names its events near the top (other JSON files in the folder, such as notes, do not)."""
    import gzip

    try:
        with (gzip.open(path) if path.name.endswith(".gz") else path.open("rb")) as f:
            head = f.read(1 << 16)
    except OSError:
        return True  # unreadable: let the loader say why
    return b'"traceEvents"' in head or head.lstrip()[:1] == b"["


def rank_of(c: TraceColumns, path: Path, fallback: int) -> int:
    """The rank a trace names (Kineto's distributedInfo.rank), else a number in its file name, else its place."""
    info = c.meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return int(info["rank"])
    m = re.search(r"rank[_-]?(\d+)", path.name)
    return int(m.group(1)) if m else fallback


def analyze_ranks(folder: str | Path) -> Feedback:
    """Each rank's GPU reading side by side, and the rank the others wait for."""
    folder = Path(folder)
    readings, findings_by_rank = [], {}
    for i, path in enumerate(rank_files(folder)):
        c = load_columns(path)
        rank = rank_of(c, path, i)
        gpu = read_gpu(c)
        if gpu is None:
            raise TraceFormatError(f"{path}: no GPU work (kernel, memcpy or memset) in this rank's trace")
        tb = temporal_breakdown(c)
        readings.append(RankReading(rank, str(path), round(tb.pct("idle"), 2), round(tb.pct("compute"), 2),
                                    round(tb.pct("non_compute"), 2), sum(o.comm_ns for o in device_overlaps(c)),
                                    tb.kernel_ns, gpu.signature))
        findings_by_rank[rank] = gpu.findings[0] if gpu.findings else ""
    readings.sort(key=lambda r: r.rank)
    numbers = {f"rank{r.rank}_gpu_idle_pct": Measure(r.idle_pct, "%") for r in readings}
    idle = np.asarray([r.idle_pct for r in readings])
    numbers["gpu_idle_pct_max"] = Measure(float(idle.max()), "%")
    numbers["gpu_idle_pct_min"] = Measure(float(idle.min()), "%")
    findings = [f"{len(readings)} ranks: GPU idle {idle.min():.1f}%–{idle.max():.1f}% (median {np.median(idle):.1f}%)"]
    straggler = _straggler(readings)
    if straggler is not None:
        r, median = straggler
        findings.insert(0, f"rank {r.rank} is the straggler: {r.comm_ns / 1e6:.1f} ms in communication kernels against "
                           f"a median {median / 1e6:.1f} ms, so the other ranks wait in their collectives for it; "
                           f"its GPU: {findings_by_rank[r.rank]}")
        numbers["straggler_rank"] = Measure(r.rank, "rank")
    host_bound = [r.rank for r in readings if r.host_bound]
    if host_bound:
        findings.append(f"GPU waiting on the host on rank{'s' if len(host_bound) > 1 else ''} "
                        + ", ".join(map(str, host_bound)))
    details = {"source": str(folder), "ranks": [asdict(r) for r in readings], "first_finding": findings_by_rank}
    evidence = [Evidence.of(r.source, f"rank {r.rank}'s trace") for r in readings]
    evidence.append(save_json("analyze-ranks", details, "each rank's GPU reading"))
    probes = [f"infragent analyze {straggler[0].source} (the straggler's own trace: where its time goes)"] \
        if straggler else []
    return Feedback("analyze", "fail" if straggler or host_bound else "pass", "; ".join(findings),
                    numbers=numbers, locality={"trace": str(folder), "ranks": str(len(readings))},
                    evidence=evidence, next_probes=probes, details=details)


def _straggler(readings: list[RankReading]) -> tuple[RankReading, float] | None:
    """The rank with clearly the least communication time (the others wait for it), with the median."""
    comm = np.asarray([r.comm_ns for r in readings], float)
    if len(readings) < 2 or not comm.any():
        return None
    median = float(np.median(comm))
    least = readings[int(np.argmin(comm))]
    return (least, median) if least.comm_ns < STRAGGLER_GAP * median else None
