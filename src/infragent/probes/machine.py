"""Measured machine peaks for the roofline (fp32 matmul, copy, fp32 GEMV stream, per-op floor), cached per machine;
Roofs: the three roofs one call is classified against, which CPU Peaks and GPU GpuPeaks both give."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.nn.functional as F

MIB = 1 << 20
CACHE_ENV = "INFRAGENT_CACHE_DIR"
REMEASURE_ENV = "INFRAGENT_REMEASURE"
CONTENDED_CORES = 0.25  # other processes using more CPU than this (in cores) make a measurement contended

# Working-set sizes: full mode streams far more than any last-level cache; quick mode trades that for speed.
# Each roof is the best of at least `iters` runs spread over at least `min_s` seconds, so a busy moment on a
# shared machine is less likely to be what gets cached.
_SIZES = {
    False: dict(gemv_bytes=1024 * MIB, copy_bytes=512 * MIB, matmul=2048, iters=5, min_s=0.5),
    True: dict(gemv_bytes=256 * MIB, copy_bytes=128 * MIB, matmul=1024, iters=3, min_s=0.1),
}


@dataclass(frozen=True)
class Roofs:
    """The compute, memory and per-op roofs one call is classified against, each named."""

    compute_flops_per_s: float
    compute_name: str
    memory_bytes_per_s: float
    memory_name: str
    op_floor_s: float
    floor_name: str

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the compute roof meets the memory roof."""
        return self.compute_flops_per_s / self.memory_bytes_per_s


class HasRoofs(Protocol):
    """Measured peaks of some device: the roofs for a call's dtype, and plain data for reports."""

    def roofs(self, dtype: torch.dtype | None = None, tf32: bool = False) -> Roofs: ...

    def to_dict(self) -> dict[str, Any]: ...


@dataclass
class Peaks:
    """What this machine can do at a fixed torch thread count: the roofs of the roofline."""

    matmul_fp32_gflops: float
    copy_bytes_per_s: float  # read + write bytes of an fp32 copy
    gemv_fp32_bytes_per_s: float  # fp32 weight bytes streamed by a one-row F.linear
    op_floor_s: float  # wall time of one tiny torch op called from Python (the fixed per-op cost)
    threads: int
    quick: bool = False
    others_cores: float = 0.0  # CPU (in cores) other processes used while measuring; see CpuWatch
    key: dict[str, Any] = field(default_factory=dict)
    measured_at: float = 0.0
    measure_s: float = 0.0

    @property
    def memory_bytes_per_s(self) -> float:
        """The memory roof: the faster of the two measured streaming bandwidths."""
        return max(self.copy_bytes_per_s, self.gemv_fp32_bytes_per_s)

    @property
    def memory_roof_name(self) -> str:
        """Which measurement the memory roof is."""
        return "copy bandwidth" if self.copy_bytes_per_s >= self.gemv_fp32_bytes_per_s else "GEMV stream bandwidth"

    @property
    def ridge_flop_per_byte(self) -> float:
        """Arithmetic intensity where the compute roof meets the memory roof."""
        return self.matmul_fp32_gflops * 1e9 / self.memory_bytes_per_s

    def roofs(self, dtype: torch.dtype | None = None, tf32: bool = False) -> Roofs:
        """The CPU's roofs; only fp32 matmul is measured, so it is the compute roof whatever the dtype."""
        return Roofs(self.matmul_fp32_gflops * 1e9, "fp32 matmul peak", self.memory_bytes_per_s,
                     self.memory_roof_name, self.op_floor_s, "per-op floor")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for the cache file and Feedback details)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Peaks":
        """Inverse of to_dict."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo (or what platform knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cpu_flags() -> list[str]:
    """The CPU's vector and matrix extensions (AVX2, AVX-512 and its VNNI/BF16 parts, AMX): what decides which
    native path a kernel takes, and why two machines' numbers differ."""
    try:
        line = next(x for x in Path("/proc/cpuinfo").read_text().splitlines() if x.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(f for f in line.split(":", 1)[1].split() if f.startswith(("avx", "amx", "fma", "f16c")))


def machine_key(threads: int | None = None) -> dict[str, Any]:
    """Identity of the machine the peaks belong to: CPU model, core count, torch threads, torch version."""
    return {"cpu_model": cpu_model(), "cpu_count": os.cpu_count() or 0,
            "threads": threads if threads is not None else torch.get_num_threads(), "torch": torch.__version__}


def cache_dir() -> Path:
    """Where cached peaks live: $INFRAGENT_CACHE_DIR, default ~/.cache/infragent."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "infragent")


def cache_path(key: dict[str, Any], quick: bool = False) -> Path:
    """The cache file of one machine key (quick and full measurements are kept apart)."""
    digest = hashlib.sha256(json.dumps({**key, "quick": quick}, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"peaks-{digest}.json"


def _best_seconds(fn: Callable[[], object], iters: int, warmup: int = 1, min_s: float = 0.0) -> float:
    """Fastest wall time of fn over at least iters calls and at least min_s seconds, after warmup calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    began = time.perf_counter()
    done = 0
    while done < iters or time.perf_counter() - began < min_s:
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
        done += 1
    return best


def _cpu_busy_s() -> float | None:
    """Seconds all CPUs have been busy (or stolen by the hypervisor) since boot, from /proc/stat; None elsewhere."""
    try:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


class CpuWatch:
    """Started at construction; others_cores() is the CPU, in cores, that other processes used since then."""

    def __init__(self) -> None:
        self.busy0, self.own0, self.wall0 = _cpu_busy_s(), time.process_time(), time.perf_counter()

    def others_cores(self) -> float | None:
        """Average cores' worth of CPU used by everything but this process (None where unknown)."""
        busy, wall = _cpu_busy_s(), time.perf_counter() - self.wall0
        if busy is None or self.busy0 is None or wall <= 0:
            return None
        return max(0.0, (busy - self.busy0 - (time.process_time() - self.own0)) / wall)


def others_cores_now(window_s: float = 0.2) -> float | None:
    """CPU, in cores, other processes use right now (sampled over window_s)."""
    watch = CpuWatch()
    time.sleep(window_s)
    return watch.others_cores()


def free_cores(window_s: float = 0.3) -> int:
    """The cores of this process's affinity that other processes leave free right now (at least 1): how many
    threads untimed work should use. A torch thread team that shares a core with a busy process waits at every
    parallel region for its descheduled member: beside one spinner on 2 cores, a quality gate's batch took 41 and
    221 s at 2 threads against 23-25 s at 1 (13.5 s alone at 2; AMD EPYC Zen 3, session 42)."""
    cores = len(os.sched_getaffinity(0))
    others = others_cores_now(window_s)
    return cores if others is None else max(1, min(cores, cores - round(others)))


def contended(peaks: "Peaks") -> bool:
    """Whether other processes used a noticeable share of the CPU while the peaks were measured."""
    return peaks.others_cores > CONTENDED_CORES


def gemv_bandwidth(weight_bytes: int = 1024 * MIB, k: int = 4096, iters: int = 5, min_s: float = 0.0) -> float:
    """Bytes/s of an fp32 [N, K] weight streamed by F.linear on one input row (decode-like GEMV)."""
    weight = torch.full((weight_bytes // (4 * k), k), 0.5)  # written, so every page is really backed
    x = torch.full((1, k), 0.25)
    return weight.numel() * 4 / _best_seconds(lambda: F.linear(x, weight), iters, min_s=min_s)


def matmul_gflops(m: int = 2048, k: int = 2048, n: int = 2048, iters: int = 5,
                  dtype: torch.dtype = torch.float32, min_s: float = 0.0) -> float:
    """GFLOP/s of an [m, k] @ [k, n] matmul in dtype."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=gen).to(dtype)
    b = torch.randn(k, n, generator=gen).to(dtype)
    return 2.0 * m * k * n / _best_seconds(lambda: torch.mm(a, b), iters, min_s=min_s) / 1e9


def copy_bandwidth(nbytes: int = 512 * MIB, iters: int = 5, min_s: float = 0.0) -> float:
    """Bytes/s moved (read + write) by an fp32 tensor copy of nbytes far bigger than cache."""
    src = torch.full((nbytes // 4,), 1.5)
    dst = torch.full_like(src, 0.0)
    return 2.0 * src.numel() * 4 / _best_seconds(lambda: dst.copy_(src), iters, min_s=min_s)


def op_floor(calls: int = 2000, repeats: int = 5) -> float:
    """Seconds per call of a 4-element torch.add from Python: the fixed cost every torch op pays."""
    a, b = torch.ones(4), torch.ones(4)

    def loop() -> None:
        for _ in range(calls):
            torch.add(a, b)

    return _best_seconds(loop, repeats) / calls


def measure_peaks(threads: int | None = None, quick: bool = False) -> Peaks:
    """Measure all roofs now, with torch pinned to threads (default: the current count) while measuring."""
    before = torch.get_num_threads()
    threads = threads or before
    n, iters, min_s = _SIZES[quick]["matmul"], _SIZES[quick]["iters"], _SIZES[quick]["min_s"]
    start, watch = time.perf_counter(), CpuWatch()
    torch.set_num_threads(threads)
    try:
        peaks = Peaks(
            matmul_fp32_gflops=matmul_gflops(n, n, n, iters, min_s=min_s),
            copy_bytes_per_s=copy_bandwidth(_SIZES[quick]["copy_bytes"], iters, min_s),
            gemv_fp32_bytes_per_s=gemv_bandwidth(_SIZES[quick]["gemv_bytes"], iters=iters, min_s=min_s),
            op_floor_s=op_floor(),
            threads=threads, quick=quick, key=machine_key(threads), measured_at=time.time())
    finally:
        torch.set_num_threads(before)
    peaks.measure_s = time.perf_counter() - start
    peaks.others_cores = watch.others_cores() or 0.0
    return peaks


def machine_peaks(threads: int | None = None, quick: bool = False, remeasure: bool = False) -> Peaks:
    """This machine's peaks from the cache, measuring (and caching) them on a miss or when asked to remeasure.

    remeasure=True or env INFRAGENT_REMEASURE=1 forces a fresh measurement. Peaks measured while the machine
    was contended (other processes busy, see CONTENDED_CORES) are measured again once the machine is quiet.
    """
    threads = threads or torch.get_num_threads()
    key = machine_key(threads)
    path = cache_path(key, quick)
    remeasure = remeasure or os.environ.get(REMEASURE_ENV, "") not in ("", "0")
    if not remeasure and path.is_file():
        try:
            cached = Peaks.from_dict(json.loads(path.read_text()))
            if cached.key == key and (not contended(cached) or (others_cores_now() or 0.0) > CONTENDED_CORES):
                return cached
        except (ValueError, TypeError, KeyError):
            pass  # unreadable or stale format: measure again
    peaks = measure_peaks(threads, quick)
    store_json(path, peaks.to_dict())
    return peaks


def store_json(path: Path, data: dict[str, Any]) -> None:
    """Write data to path as JSON atomically (a reader never sees half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, path)


def format_peaks(peaks: Peaks) -> str:
    """One line per roof."""
    return (f"GEMV fp32 weight stream: {peaks.gemv_fp32_bytes_per_s / 1e9:.2f} GB/s\n"
            f"matmul fp32:             {peaks.matmul_fp32_gflops:.1f} GFLOP/s\n"
            f"copy (read+write):       {peaks.copy_bytes_per_s / 1e9:.2f} GB/s\n"
            f"per-op floor:            {peaks.op_floor_s * 1e6:.2f} µs")
