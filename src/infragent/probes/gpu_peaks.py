"""Measured GPU peaks for the roofline (bf16/fp16 tensor-core, tf32 and fp32 matmul, HBM copy, launch floor),
cached per device under the same cache directory as the CPU peaks."""
from __future__ import annotations

import hashlib
import json
import math
import os
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from infragent.probes.machine import REMEASURE_ENV, Roofs, cache_dir, store_json

GIB = 1 << 30
MATMUL_N = 8192
COPY_BYTES = 2 * GIB  # source size; the copy reads and writes it, so 4 GiB of traffic per call
LAUNCHES = 2000
TRIAL_S = 0.05  # each timed trial repeats the kernel for about this long
TRIALS = 8
WARMUP_S = 0.1


@dataclass
class GpuPeaks:
    """What one GPU can do: the roofs of the roofline for calls whose inputs live on it."""

    bf16_flops_per_s: float
    fp16_flops_per_s: float
    tf32_flops_per_s: float
    fp32_flops_per_s: float  # TF32 off
    hbm_copy_bytes_per_s: float  # read + write bytes of a device-to-device copy
    launch_floor_s: float  # wall time of one tiny kernel launched from Python
    device_name: str = ""
    key: dict[str, Any] = field(default_factory=dict)
    measured_at: float = 0.0
    measure_s: float = 0.0

    def compute_roof(self, dtype: torch.dtype | None = None, tf32: bool = False) -> tuple[float, str]:
        """The matmul peak for a call computing in dtype (fp32 with TF32 allowed: the tf32 peak), and its name."""
        if dtype == torch.bfloat16:
            return self.bf16_flops_per_s, "bf16 tensor-core peak"
        if dtype == torch.float16:
            return self.fp16_flops_per_s, "fp16 tensor-core peak"
        if tf32 and dtype in (None, torch.float32):
            return self.tf32_flops_per_s, "tf32 tensor-core peak"
        return self.fp32_flops_per_s, "fp32 matmul peak"

    def roofs(self, dtype: torch.dtype | None = None, tf32: bool = False) -> Roofs:
        """The roofs for a call on this GPU computing in dtype."""
        compute, name = self.compute_roof(dtype, tf32)
        return Roofs(compute, name, self.hbm_copy_bytes_per_s, "HBM copy bandwidth", self.launch_floor_s,
                     "launch floor")

    def to_dict(self) -> dict[str, Any]:
        """Plain data (for the cache file and Feedback details)."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GpuPeaks":
        """Inverse of to_dict (keys it does not know, such as a note, are ignored)."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def _index(device: torch.device | str | int) -> int:
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    return device.index if device.index is not None else torch.cuda.current_device()


def gpu_key(device: torch.device | str | int = "cuda") -> dict[str, Any]:
    """Identity of the GPU the peaks belong to: device name, compute capability, torch and CUDA versions."""
    index = _index(device)
    major, minor = torch.cuda.get_device_capability(index)
    return {"device_name": torch.cuda.get_device_name(index), "capability": f"{major}.{minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda}


def gpu_cache_path(key: dict[str, Any]) -> Path:
    """The cache file of one GPU key."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"gpu-peaks-{digest}.json"


def tf32_allowed() -> bool:
    """Whether cuBLAS may run fp32 matmuls in TF32 now (torch.backends.cuda.matmul's setting)."""
    matmul = torch.backends.cuda.matmul
    try:
        setting = matmul.fp32_precision
    except AttributeError:  # torch before the fp32_precision API
        return bool(matmul.allow_tf32)
    if setting == "none":
        setting = getattr(torch.backends, "fp32_precision", "none")
    return setting == "tf32"


@contextmanager
def fp32_matmul_tf32(allow: bool) -> Iterator[None]:
    """cuBLAS fp32 matmuls with TF32 allowed or not inside the block; the setting before is put back after."""
    matmul = torch.backends.cuda.matmul
    try:
        before, new_api = matmul.fp32_precision, True
    except AttributeError:
        before, new_api = matmul.allow_tf32, False
    if new_api:
        matmul.fp32_precision = "tf32" if allow else "ieee"
    else:
        matmul.allow_tf32 = allow
    try:
        yield
    finally:
        if new_api:
            matmul.fp32_precision = before
        else:
            matmul.allow_tf32 = before


def _event_seconds(fn: Callable[[], object], reps: int) -> float:
    """GPU seconds per call of reps back-to-back calls of fn, between two CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / reps


def best_event_seconds(fn: Callable[[], object], trials: int = TRIALS, trial_s: float = TRIAL_S,
                       warmup_s: float = WARMUP_S) -> float:
    """Fastest GPU seconds per call of fn over trials, each repeating fn for about trial_s, after calling it for
    about warmup_s (clocks up, libraries loaded)."""
    began = time.perf_counter()
    while time.perf_counter() - began < warmup_s:
        fn()
        torch.cuda.synchronize()
    reps = max(1, min(200, math.ceil(trial_s / max(_event_seconds(fn, 1), 1e-7))))
    return min(_event_seconds(fn, reps) for _ in range(trials))


def matmul_flops_per_s(device: torch.device, dtype: torch.dtype, n: int = MATMUL_N, tf32: bool = False) -> float:
    """FLOP/s of an [n, n] @ [n, n] matmul in dtype on device (fp32: TF32 allowed or not, as asked)."""
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    b = torch.randn(n, n, device=device, dtype=dtype, generator=gen)
    out = torch.empty(n, n, device=device, dtype=dtype)
    with fp32_matmul_tf32(tf32):
        seconds = best_event_seconds(lambda: torch.mm(a, b, out=out))
    return 2.0 * n ** 3 / seconds


def hbm_copy_bytes_per_s(device: torch.device, nbytes: int = COPY_BYTES) -> float:
    """Bytes/s moved (read + write) by a device-to-device copy of nbytes (capped at a quarter of free memory)."""
    free, _total = torch.cuda.mem_get_info(device)
    numel = min(nbytes, free // 4) // 4
    src = torch.full((numel,), 1.5, device=device)
    dst = torch.empty_like(src)
    return 2.0 * numel * 4 / best_event_seconds(lambda: dst.copy_(src))


def launch_floor_s(device: torch.device, calls: int = LAUNCHES, repeats: int = 20) -> float:
    """Wall seconds per call of x.add_(1) on a 1-element tensor from Python, calls in a row, synchronized once."""
    x = torch.zeros(1, device=device)
    best = float("inf")
    for i in range(repeats + 1):
        torch.cuda.synchronize(device)
        start = time.perf_counter()
        for _ in range(calls):
            x.add_(1)
        torch.cuda.synchronize(device)
        if i:  # the first round is the warm-up
            best = min(best, time.perf_counter() - start)
    return best / calls


def measure_gpu_peaks(device: torch.device | str | int = "cuda") -> GpuPeaks:
    """Measure all of one GPU's roofs now (a few seconds on a recent GPU)."""
    device = torch.device("cuda", _index(device))
    began = time.perf_counter()
    with torch.cuda.device(device):
        peaks = GpuPeaks(
            bf16_flops_per_s=matmul_flops_per_s(device, torch.bfloat16),
            fp16_flops_per_s=matmul_flops_per_s(device, torch.float16),
            tf32_flops_per_s=matmul_flops_per_s(device, torch.float32, tf32=True),
            fp32_flops_per_s=matmul_flops_per_s(device, torch.float32, tf32=False),
            hbm_copy_bytes_per_s=hbm_copy_bytes_per_s(device),
            launch_floor_s=launch_floor_s(device),
            device_name=torch.cuda.get_device_name(device), key=gpu_key(device), measured_at=time.time())
        torch.cuda.empty_cache()  # hand the measurement's buffers back
    peaks.measure_s = time.perf_counter() - began
    return peaks


def gpu_peaks(device: torch.device | str | int = "cuda", remeasure: bool = False) -> GpuPeaks:
    """One GPU's peaks from the cache, measuring (and caching) them on a miss or when asked to remeasure
    (remeasure=True or env INFRAGENT_REMEASURE=1)."""
    key = gpu_key(device)
    path = gpu_cache_path(key)
    remeasure = remeasure or os.environ.get(REMEASURE_ENV, "") not in ("", "0")
    if not remeasure and path.is_file():
        try:
            cached = GpuPeaks.from_dict(json.loads(path.read_text()))
            if cached.key == key:
                return cached
        except (ValueError, TypeError, KeyError):
            pass  # unreadable or stale format: measure again
    peaks = measure_gpu_peaks(device)
    store_json(path, peaks.to_dict())
    return peaks
