"""The roofline on a GPU: recorded H200 peaks, the roof each dtype picks, the per-device cache, and (with a GPU)
real peaks and real CUDA calls."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import roofline_cases as rc
import torch

from infragent.probes import gpu_peaks as gp
from infragent.probes import roofline
from infragent.probes.gpu_peaks import GpuPeaks, fp32_matmul_tf32, gpu_cache_path, gpu_key, tf32_allowed
from infragent.probes.inputs import Case
from infragent.probes.machine import Peaks
from infragent.probes.roofline import case_device, classify, compute_dtype, measure_roofline, run_roofline
from infragent.probes.work import WorkCount

RECORDED = Path(__file__).parent / "data" / "gpu_peaks_h200.json"
GIB = 1 << 30
N = 8192
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test gets its own empty peaks cache and no forced re-measure."""
    monkeypatch.setenv("INFRAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("INFRAGENT_REMEASURE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def h200() -> GpuPeaks:
    """The recorded H200 figures."""
    return GpuPeaks.from_dict(json.loads(RECORDED.read_text()))


def gemm(n: int, itemsize: int) -> WorkCount:
    """An [n, n] @ [n, n] matmul: 2n^3 FLOPs, A and B read and C written once."""
    return WorkCount(flops=2.0 * n ** 3, bytes=3.0 * n * n * itemsize, source="given", ops=1)


# ---- classification on recorded figures ----------------------------------------------------------------------

def test_recorded_figures_load(h200):
    assert "recorded figures for tests" in json.loads(RECORDED.read_text())["note"]
    assert h200.bf16_flops_per_s == 7.87e14 and h200.hbm_copy_bytes_per_s == 4.30e12
    assert h200.key["device_name"] == h200.device_name == "NVIDIA H200"


def test_bf16_gemm_is_compute_bound_against_the_bf16_roof(h200):
    c = classify(gemm(N, 2), 1.8e-3, h200, torch.bfloat16)  # 1.10e12 FLOPs, 403 MB
    assert c.bound == "compute-bound" and c.roof == "bf16 tensor-core peak"
    assert c.t_compute_s == pytest.approx(1.397e-3, rel=1e-3)  # 1.10e12 / 7.87e14
    assert c.t_memory_s == pytest.approx(93.6e-6, rel=1e-3)  # 403 MB / 4.30e12
    assert c.pct_of_peak == pytest.approx(0.776, rel=1e-3)
    assert c.ridge == pytest.approx(183.0, rel=1e-3)
    assert classify(gemm(N, 2), 1.8e-3, h200, torch.float16).roof == "fp16 tensor-core peak"


def test_gib_copy_is_memory_bound_against_hbm(h200):
    copy = WorkCount(flops=0.0, bytes=2.0 * GIB, source="given", ops=1)  # 1 GiB read and 1 GiB written
    c = classify(copy, 0.6e-3, h200, torch.float32)
    assert c.bound == "memory-bound" and c.roof == "HBM copy bandwidth"
    assert c.t_memory_s == pytest.approx(0.4994e-3, rel=1e-3)  # 2 GiB / 4.30e12
    assert c.pct_of_peak == pytest.approx(0.832, rel=1e-3)


def test_tiny_ops_are_overhead_bound_against_the_launch_floor(h200):
    tiny = WorkCount(flops=24.0, bytes=24 * 12.0, source="given", ops=24)
    c = classify(tiny, 300e-6, h200, torch.float32)
    assert c.bound == "overhead-bound" and c.roof == "launch floor"
    assert c.pct_of_peak == pytest.approx(0.752)  # 24 x 9.4 µs of 300 µs


def test_fp32_matmul_picks_fp32_roof_or_tf32_when_allowed(h200):
    fp32 = classify(gemm(N, 4), 25e-3, h200, torch.float32, tf32=False)
    assert fp32.roof == "fp32 matmul peak" and fp32.t_compute_s == pytest.approx(21.52e-3, rel=1e-3)
    tf32 = classify(gemm(N, 4), 3.5e-3, h200, torch.float32, tf32=True)
    assert tf32.bound == "compute-bound" and tf32.roof == "tf32 tensor-core peak"
    assert tf32.t_compute_s == pytest.approx(2.841e-3, rel=1e-3)
    assert h200.roofs(torch.bfloat16, tf32=True).compute_name == "bf16 tensor-core peak"  # TF32 is fp32 only


# ---- which device and dtype a case has -----------------------------------------------------------------------

def test_case_device_and_compute_dtype():
    case = Case(args=(torch.ones(4, dtype=torch.bfloat16), torch.ones(2), 3), kwargs={"i": torch.ones(9).long()})
    assert case_device(case) == torch.device("cpu")
    assert compute_dtype(case) == torch.bfloat16  # the floating dtype with the most elements
    assert compute_dtype(Case(args=(torch.ones(3).long(),))) is None


def test_cuda_inputs_route_to_gpu_peaks_and_synchronize(monkeypatch, h200):
    """With the case taken for a CUDA one: GPU peaks for its device, its dtype's roof, a sync per sample."""
    asked, syncs = [], []
    monkeypatch.setattr(roofline, "case_device", lambda case: torch.device("cuda", 0))
    monkeypatch.setattr(roofline, "gpu_peaks", lambda device, remeasure=False: asked.append(device) or h200)
    monkeypatch.setattr(roofline, "machine_peaks", lambda *a, **k: pytest.fail("CPU peaks for CUDA inputs"))
    monkeypatch.setattr(roofline, "_synchronizer", lambda device: lambda: syncs.append(device))
    bf16 = lambda trial, gen: (torch.randn(64, 64, generator=gen).bfloat16(),) * 2  # noqa: E731
    fb = run_roofline(torch.mm, bf16, budget_s=0.05)
    assert asked == [torch.device("cuda", 0)]
    assert len(syncs) >= 2 + fb.numbers["time_us"].n  # after the warm-up, each calibration round and each sample
    roofs = fb.details["roofs"]
    assert roofs["compute_name"] == "bf16 tensor-core peak" and roofs["memory_name"] == "HBM copy bandwidth"
    assert fb.details["roof"] == "launch floor"  # a 64^3 matmul on an H200 is all launch
    assert fb.details["device"] == "cuda:0" and fb.details["dtype"] == "bfloat16"

    monkeypatch.setattr(roofline, "tf32_allowed", lambda: True)
    result = measure_roofline(torch.add, rc.tiny_add_inputs, budget_s=0.05)
    assert result.roofs.compute_name == "tf32 tensor-core peak"


def test_cpu_inputs_keep_the_cpu_roofs():
    peaks = Peaks(matmul_fp32_gflops=100.0, copy_bytes_per_s=10e9, gemv_fp32_bytes_per_s=8e9, op_floor_s=2e-6,
                  threads=1)
    result = measure_roofline(torch.mm, rc.matmul_inputs, peaks=peaks, budget_s=0.05)
    assert result.device == "cpu" and result.roofs.compute_name == "fp32 matmul peak"


def test_tf32_setting_is_restored():
    before = torch.backends.cuda.matmul.fp32_precision
    with fp32_matmul_tf32(True):
        assert tf32_allowed()
        with fp32_matmul_tf32(False):
            assert not tf32_allowed()
        assert tf32_allowed()
    assert torch.backends.cuda.matmul.fp32_precision == before


# ---- the per-device cache ------------------------------------------------------------------------------------

@pytest.fixture
def fake_gpu(monkeypatch, h200):
    """torch.cuda answering as an H200 at index 0, and measure_gpu_peaks returning the recorded figures."""
    name = {"value": "NVIDIA H200"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=None: name["value"])
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (9, 0))
    calls = []

    def measure(device="cuda"):
        calls.append(device)
        return GpuPeaks.from_dict({**h200.to_dict(), "key": gpu_key(device), "device_name": name["value"]})

    monkeypatch.setattr(gp, "measure_gpu_peaks", measure)
    return calls, name


def test_gpu_key_names_device_capability_torch_and_cuda(fake_gpu):
    assert gpu_key("cuda:0") == {"device_name": "NVIDIA H200", "capability": "9.0", "torch": torch.__version__,
                                 "cuda": torch.version.cuda}
    assert gpu_key(0) == gpu_key(torch.device("cuda", 0))


def test_gpu_peaks_cache_round_trip(fake_gpu, cache_dir, monkeypatch):
    calls, name = fake_gpu
    first = gp.gpu_peaks("cuda:0")
    assert gp.gpu_peaks("cuda:0") == first and len(calls) == 1  # the second reads the cache
    path = gpu_cache_path(gpu_key("cuda:0"))
    assert path.parent == cache_dir and path.name.startswith("gpu-peaks-")
    stored = json.loads(path.read_text())
    assert GpuPeaks.from_dict(stored) == first and stored["key"]["capability"] == "9.0"

    name["value"] = "NVIDIA H100 80GB HBM3"  # another device is another key
    gp.gpu_peaks("cuda:0")
    assert len(calls) == 2 and len(list(cache_dir.glob("gpu-peaks-*.json"))) == 2
    name["value"] = "NVIDIA H200"
    gp.gpu_peaks("cuda:0")
    assert len(calls) == 2

    gp.gpu_peaks("cuda:0", remeasure=True)
    monkeypatch.setenv("INFRAGENT_REMEASURE", "1")
    gp.gpu_peaks("cuda:0")
    assert len(calls) == 4

    monkeypatch.delenv("INFRAGENT_REMEASURE")
    path.write_text("{not json")
    gp.gpu_peaks("cuda:0")
    assert len(calls) == 5


# ---- on a real GPU ---------------------------------------------------------------------------------------------

def cuda_bf16_gemm(trial: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A [4096, 4096] @ [4096, 4096] bf16 matmul on the GPU."""
    g = torch.Generator("cuda").manual_seed(trial)
    return tuple(torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))


def cuda_large_add(trial: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 64M-element fp32 vectors (256 MiB each) on the GPU: 1 FLOP per 12 bytes."""
    g = torch.Generator("cuda").manual_seed(trial)
    return tuple(torch.randn(1 << 26, device="cuda", generator=g) for _ in range(2))


def cuda_tiny(trial: int, gen: torch.Generator) -> torch.Tensor:
    """A 4-element fp32 tensor on the GPU."""
    return torch.ones(4, device="cuda")


def tiny_ops(x: torch.Tensor) -> torch.Tensor:
    """24 tiny kernels in a row."""
    for _ in range(24):
        x = x + 1
    return x


@needs_cuda
def test_measured_gpu_peaks_are_plausible_and_cached(cache_dir):
    peaks = gp.gpu_peaks("cuda")
    assert peaks.bf16_flops_per_s > peaks.fp32_flops_per_s > 1e12
    assert peaks.tf32_flops_per_s > peaks.fp32_flops_per_s
    assert peaks.hbm_copy_bytes_per_s > 1e11 and 0 < peaks.launch_floor_s < 1e-3
    assert peaks.key == gpu_key("cuda") and gp.gpu_peaks("cuda") == peaks
    assert len(list(cache_dir.glob("gpu-peaks-*.json"))) == 1


@needs_cuda
@pytest.mark.parametrize("fn, factory, bound, roof", [
    (torch.mm, cuda_bf16_gemm, "compute-bound", "bf16 tensor-core peak"),
    (torch.add, cuda_large_add, "memory-bound", "HBM copy bandwidth"),
    (tiny_ops, cuda_tiny, "overhead-bound", "launch floor"),
])
def test_cuda_calls_classified_against_the_gpu(fn, factory, bound, roof):
    fb = run_roofline(fn, factory, budget_s=0.3)
    assert fb.details["device"].startswith("cuda") and fb.details["bound"] == bound and fb.details["roof"] == roof
    assert 0.2 < fb.numbers["pct_of_peak"].value / 100 < 1.3, fb.finding
    if fn is torch.mm:
        assert fb.numbers["flops"].value == 2 * 4096 ** 3  # FlopCounterMode counts CUDA matmuls
