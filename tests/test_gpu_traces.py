"""GPU trace analyses on real torch.profiler traces from an H200 (tests/data/h200, copied from
../shared/traces/h200 with the README that gives each one's truth), and on small hand-built Kineto traces
where a cause must be told apart (another stream, sync, several devices)."""
from __future__ import annotations

import gzip
import json
import math
import re
from pathlib import Path

import pytest

from infragent.analysis.gpu_idle import gpu_idle
from infragent.analysis.gpu_overlap import device_overlaps, step_gpu
from infragent.analysis.gpu_steps import steps
from infragent.analysis.gpu_time import device_breakdowns, temporal_breakdown
from infragent.analysis.kernel_names import kernel_kind, kernel_source, short_name
from infragent.analysis.kineto import device_work, launches
from infragent.analysis.trace_load import load_columns
from infragent.probes.analyze import analyze
from infragent.trace_model import TraceFormatError

H200 = Path(__file__).parent / "data" / "h200"
TRACES = ["llama8_prefill_sidecopy", "mlp_eager_vs_cudagraph", "gemm_with_h2d_copy", "flash_attention_long"]


def _truth() -> dict[str, tuple[float, float, float]]:
    """The README's truth column: idle / compute / non-compute % per trace."""
    rows = {}
    for line in (H200 / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*(\w+)\.json\.gz\s*\|[^|]*\|\s*([\d.]+) / ([\d.]+) / ([\d.]+)", line)
        if m:
            rows[m.group(1)] = tuple(float(x) for x in m.group(2, 3, 4))
    return rows


def _trace(name: str) -> Path:
    return H200 / f"{name}.json.gz"


@pytest.mark.parametrize("name", TRACES)
def test_every_shared_trace_reads_within_a_point_of_its_truth(name):
    truth = _truth()
    assert set(truth) == set(TRACES)
    tb = temporal_breakdown(load_columns(_trace(name)))
    for part, expected in zip(("idle", "compute", "non_compute"), truth[name]):
        assert tb.pct(part) == pytest.approx(expected, abs=1.0), (name, part)


@pytest.mark.parametrize("name", TRACES)
def test_hta_figures_are_ours_on_hta_rounded_timestamps(name, tmp_path):
    """HTA 0.5 moves each start up and each end down to whole µs: on those timestamps we give its figures (where
    it runs), which is the whole definitional difference; events that rounding turns negative are what crash it."""
    data = json.loads(gzip.open(_trace(name)).read())
    for e in data["traceEvents"]:
        if e.get("ph") == "X":
            start, end = math.ceil(e["ts"]), math.floor(e["ts"] + e["dur"])
            e["ts"], e["dur"] = start, max(end - start, 0)
    (tmp_path / "rounded.json").write_text(json.dumps(data))
    ours = temporal_breakdown(load_columns(tmp_path / "rounded.json"))
    hta = {"llama8_prefill_sidecopy": (76.9, 12.3, 10.8), "mlp_eager_vs_cudagraph": (92.5, 7.5, 0.0),
           "gemm_with_h2d_copy": (0.8, 89.5, 9.8)}  # the README's HTA column
    if name in hta:
        for part, expected in zip(("idle", "compute", "non_compute"), hta[name]):
            assert ours.pct(part) == pytest.approx(expected, abs=0.1), (name, part)


def _eager_half(tmp_path: Path) -> Path:
    """The eager half of mlp_eager_vs_cudagraph: a decode-like batch-16 MLP stack launched kernel by kernel."""
    data = json.loads(gzip.open(_trace("mlp_eager_vs_cudagraph")).read())
    events = data["traceEvents"]
    cut = min(e["ts"] for e in events if e.get("name") == "graphed" and e.get("cat") == "user_annotation")
    data["traceEvents"] = [e for e in events if e.get("ph") == "M" or e.get("ts", 0) < cut]
    path = tmp_path / "eager.json"
    path.write_text(json.dumps(data))
    return path


def test_the_eager_decode_like_half_waits_on_the_host_and_proposes_graphs_and_batching(tmp_path):
    fb = analyze(_eager_half(tmp_path))
    assert fb.verdict == "fail"
    assert fb.numbers["gpu_idle_pct"].value > 85
    assert fb.numbers["gpu_idle_on_host_pct"].value > 90
    assert 1 < fb.numbers["launch_lag_median_us"].value < 100
    assert fb.finding.startswith("GPU idle") and "waiting on the host" in fb.finding
    assert "median launch→start lag" in fb.finding and "kernels median" in fb.finding
    remedies = {h["remedy"] for h in fb.details["gpu"]["hypotheses"]}
    assert {"CUDA graphs", "larger batches"} <= remedies
    assert not any("gil" in p for p in fb.next_probes)
    assert "CUDA graphs" in fb.next_probes[0]


def test_eager_steps_and_graph_replays_are_told_apart():
    c = load_columns(_trace("mlp_eager_vs_cudagraph"))
    work = device_work(c)
    launched = launches(c, work)
    stats = gpu_idle(c, launched)[0].launch
    assert (stats.eager, stats.graph, stats.graph_launches) == (480, 480, 10)
    per_step = step_gpu(c, steps(c, work, launched), launched)
    assert [s.mode for s in per_step] == ["eager"] * 10 + ["graph"] * 10
    eager = [s.idle_share for s in per_step if s.mode == "eager"]
    graph = [s.idle_share for s in per_step if s.mode == "graph"]
    assert min(eager) > 0.8 and max(graph) < 0.5


def test_copy_overlap_is_reported_per_step_on_gemm_with_h2d_copy():
    c = load_columns(_trace("gemm_with_h2d_copy"))
    o = device_overlaps(c)[0]
    assert o.copy_overlap_share == pytest.approx(0.56, abs=0.01)
    work = device_work(c)
    launched = launches(c, work)
    by_step = {s.index: s.copy_overlap_share for s in step_gpu(c, steps(c, work, launched), launched) if s.copy_ns}
    assert all(by_step[i] > 0.9 for i in (2, 3, 4, 5)) and all(by_step[i] < 0.01 for i in (6, 7, 8))
    fb = analyze(_trace("gemm_with_h2d_copy"))
    assert "copies under computation 56%" in fb.finding and "2: 98%" in fb.finding and "6: 0%" in fb.finding
    assert "host runs ahead" in fb.finding  # 40 big GEMMs queued per step: GPU-bound, not host-bound
    assert fb.verdict == "pass"


@pytest.mark.parametrize("name", TRACES)
def test_no_gil_hint_comes_from_a_host_thread_against_a_gpu_stream(name):
    fb = analyze(_trace(name))
    for pair in fb.details["never_overlapping"]:
        assert "stream" not in pair["a"] and "stream" not in pair["b"]
    assert not any("gil" in p for p in fb.next_probes)
    assert "NEVER OVERLAP" not in fb.finding
    assert "PyTorch Profiler" not in fb.finding  # the profiler's own Trace span is not the program's work


def test_kernel_names_are_shortened_and_kinds_known_with_full_names_kept():
    gelu = ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&,"
            " at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(c10::BFloat16)#1}, std::array<char*, 2ul>"
            " >(int, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType))")
    assert short_name(gelu) == "vectorized_elementwise_kernel[gelu]"
    assert (kernel_kind(gelu), kernel_source(gelu)) == ("elementwise/reduction", "ATen")
    assert kernel_kind("nvjet_sm90_tst_64x8_64x16_4x2_h_bz_bias_TNT") == "gemm"
    assert kernel_kind("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7") == "attention"
    assert kernel_kind("triton_poi_fused_add_mul_0") == "elementwise/reduction"
    assert kernel_source("triton_poi_fused_add_mul_0") == "Triton"
    assert kernel_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "communication"
    assert kernel_kind("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "memory"
    assert short_name("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_"
                      "128x32_8x5_nn_align1::Params)") == "cutlass_80_simt_sgemm_128x32_8x5_nn_align1"
    fb = analyze(_trace("llama8_prefill_sidecopy"))
    top = fb.details["gpu"]["kernels"]["top"]
    assert all(len(k["short"]) <= 80 for k in top)
    assert any(len(k["name"]) > 200 for k in top)  # the full name stays in the data


# Hand-built Kineto traces: a host thread (pid 1) launching onto streams of device 0 (and 1).

def _launch(name, ts, dur, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr, stream=7, device=0, cat="kernel"):
    return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream, "ts": ts, "dur": dur,
            "args": {"correlation": corr, "stream": stream, "device": device}}


def _write(tmp_path: Path, events: list) -> Path:
    path = tmp_path / "k.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": events}))
    return path


def test_a_wait_on_another_stream_a_host_gap_and_a_sync_are_told_apart(tmp_path):
    events = [
        _launch("cudaLaunchKernel", 0, 2, 1), _kernel("sgemm", 3, 97, 1, stream=7),  # stream 7 [3, 100)
        _launch("cudaLaunchKernel", 2, 2, 2), _kernel("relu_a", 4, 6, 2, stream=8),  # stream 8 [4, 10)
        _launch("cudaLaunchKernel", 5, 2, 3), _kernel("relu_b", 101, 9, 3, stream=8),  # pending; after sgemm
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": 8, "dur": 103},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 120, "dur": 60},
        _launch("cudaLaunchKernel", 190, 5, 4), _kernel("relu_c", 196, 4, 4, stream=7),  # the host was late
    ]
    device = gpu_idle(load_columns(_write(tmp_path, events)))[0]
    streams = {s.stream: s for s in device.streams}
    assert streams["stream 8"].by_cause["another stream"] == 91_000  # [10, 101): waited for sgemm
    assert device.by_cause == {"host": 86_000, "another stream": 1_000, "other": 0}  # [110, 196); [100, 101)
    assert device.host_parts["sync"] == 1_000  # [110, 111) the sync call returned
    assert device.host_parts["python/cpu"] == 79_000  # [111, 190): aten::add and untraced time
    assert device.host_parts["launch"] == 6_000  # [190, 196): the launch call and its latency


def test_several_devices_are_read_one_by_one(tmp_path):
    events = [_launch("cudaLaunchKernel", 0, 1, 1), _kernel("sgemm", 1, 9, 1, device=0),
              _launch("cudaLaunchKernel", 1, 1, 2), _kernel("sgemm", 20, 10, 2, device=0),
              _launch("cudaLaunchKernel", 2, 1, 3), _kernel("sgemm", 2, 10, 3, device=1),
              _launch("cudaLaunchKernel", 3, 1, 4), _kernel("Memcpy DtoD (Device -> Device)", 12, 10, 4, device=1,
                                                            cat="gpu_memcpy")]
    c = load_columns(_write(tmp_path, events))
    parts = {p.device: p for p in device_breakdowns(c)}
    assert (parts[0].kernel_ns, parts[0].idle_ns, parts[0].compute_ns) == (29_000, 10_000, 19_000)
    assert (parts[1].kernel_ns, parts[1].idle_ns, parts[1].non_compute_ns) == (20_000, 0, 10_000)
    fb = analyze(c)
    assert {"gpu0_idle_pct", "gpu1_idle_pct", "gpu0_launch_lag_median_us", "gpu1_launch_lag_median_us"} <= set(fb.numbers)


def test_gpu_user_annotations_are_not_work(tmp_path):
    events = [_launch("cudaLaunchKernel", 0, 1, 1), _kernel("sgemm", 1, 9, 1),
              _launch("cudaLaunchKernel", 50, 1, 2), _kernel("sgemm", 91, 9, 2),
              {"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "pid": 0, "tid": 7, "ts": 1, "dur": 99}]
    tb = temporal_breakdown(load_columns(_write(tmp_path, events)))
    assert (tb.kernel_ns, tb.idle_ns, tb.compute_ns) == (99_000, 81_000, 18_000)


def test_a_launch_bound_trace_poses_hypotheses_on_the_knobs_that_can_move_it(tmp_path):
    from infragent.agent.hypotheses import from_analysis
    from infragent.lab.spec import Knob

    knobs = {"enforce_eager": Knob(type="bool"), "max_num_seqs": Knob(type="int", domain=[1, 256]),
             "block_size": Knob(type="choice", domain=[16, 32])}
    found = from_analysis(analyze(_eager_half(tmp_path)), knobs)
    by_remedy = {h.locality.get("remedy"): h for h in found if h.locality.get("bound") == "host-bound"}
    assert by_remedy["CUDA graphs"].knobs == ["enforce_eager"]
    assert by_remedy["larger batches"].knobs == ["max_num_seqs"]
    assert by_remedy["CUDA graphs"].probe == "local_ab" and by_remedy["fusion"].probe == "record"
    assert not any(h.probe == "gil" for h in found)


def test_the_analyze_page_draws_the_gpu(tmp_path):
    from infragent.report.probe_page import write_probe_page

    page = write_probe_page(analyze(_trace("mlp_eager_vs_cudagraph")), tmp_path / "a.html").read_text()
    assert "GPU 0: idle 20.9 of 23.7 ms, by cause" in page and "The host&#x27;s side" in page
    assert "vectorized_elementwise_kernel[gelu]" in page and "GeluCUDAKernelImpl" in page  # full name in the tip
    assert "<td>graphed</td><td>graph</td>" in page and "<td>eager</td><td>eager</td>" in page


def test_a_graphed_step_against_eager_ones_shows_the_gpu_time_it_saves(tmp_path):
    eager = _eager_half(tmp_path)
    data = json.loads(gzip.open(_trace("mlp_eager_vs_cudagraph")).read())
    cut = min(e["ts"] for e in data["traceEvents"] if e.get("name") == "graphed" and e.get("cat") == "user_annotation")
    data["traceEvents"] = [e for e in data["traceEvents"] if e.get("ph") == "M" or e.get("ts", 0) >= cut]
    (tmp_path / "graphed.json").write_text(json.dumps(data))
    fb = analyze(tmp_path / "graphed.json", vs=eager)
    assert fb.finding.startswith("GPU against the baseline: idle 9")
    assert fb.numbers["gpu_time_per_step_change_pct"].value < -50  # the same MLP stack, replayed as a graph


def test_graph_replays_that_still_wait_on_the_host_ask_for_overlap_not_graphs(tmp_path):
    events = []
    for step in range(6):
        t = 100 * step
        events.append(_launch("cudaGraphLaunch", t, 5, step))
        events += [_kernel("nvjet_sm90_tst_64x8", t + 8 + 3 * k, 2, step) for k in range(3)]
    fb = analyze(_write(tmp_path, events))
    assert fb.verdict == "fail" and "waiting on the host" in fb.finding
    remedies = [h["remedy"] for h in fb.details["gpu"]["hypotheses"]]
    assert "overlap the host" in remedies and "larger batches" in remedies
    assert "CUDA graphs" not in remedies and "fusion" not in remedies


MORE = Path(__file__).parent / "data" / "h200_more"  # captured in session 28 by benchmarks/make_gpu_traces.py


def test_the_more_traces_read_within_a_point_of_their_truth():
    for line in (MORE / "README.md").read_text().splitlines():
        m = re.match(r"\|\s*(\w+)\.json\.gz\s*\|[^|]*\|\s*([\d.]+) / ([\d.]+) / ([\d.]+)", line)
        if m:
            tb = temporal_breakdown(load_columns(MORE / f"{m.group(1)}.json.gz"))
            for part, expected in zip(("idle", "compute", "non_compute"), m.group(2, 3, 4)):
                assert tb.pct(part) == pytest.approx(float(expected), abs=1.0), (m.group(1), part)


def test_a_batch_1_decode_names_the_host_op_that_keeps_the_gpu_waiting():
    fb = analyze(MORE / "decode_b1_eager.json.gz")
    assert fb.verdict == "fail" and fb.numbers["gpu_idle_pct"].value > 99
    assert "waiting on the host" in fb.finding and "aten::_cudnn_attention_forward 9" in fb.finding
    first = fb.details["gpu"]["hypotheses"][0]
    assert first["remedy"] == "a cheaper host op" and "aten::_cudnn_attention_forward" in first["claim"]
    assert "CUDA graphs" in {h["remedy"] for h in fb.details["gpu"]["hypotheses"]}
    assert [s["name"] for s in fb.details["gpu"]["steps"]] == [f"ProfilerStep#{i}" for i in range(3, 15)]


def test_compiled_steps_show_triton_and_their_graph_replays_apart():
    fb = analyze(MORE / "compiled_mlp.json.gz")
    sources = {k["kind"] for k in fb.details["gpu"]["kernels"]["sources"]}
    assert "Triton" in sources
    modes = [s["mode"] for s in fb.details["gpu"]["steps"]]
    assert modes == ["eager"] * 8 + ["graph"] * 8
    assert fb.numbers["graph_step_gpu_idle_pct"].value < fb.numbers["eager_step_gpu_idle_pct"].value - 30


def test_gemms_on_two_streams_overlap_and_the_gpu_is_not_host_bound():
    fb = analyze(MORE / "two_stream_gemms.json.gz")
    assert fb.verdict == "pass" and "host runs ahead" in fb.finding
    assert device_overlaps(load_columns(MORE / "two_stream_gemms.json.gz"))[0].compute_concurrent_ns > 1_000_000
    assert "computation on two or more streams at once" in fb.finding
    assert "roofline" in fb.next_probes[0]


def test_a_folder_of_ranks_names_the_straggler(tmp_path):
    """Two ranks run the same step: rank 1 computes 10 ms, rank 0 5 ms and then waits 5 ms in the all-reduce."""
    for rank, compute in ((0, 5_000), (1, 10_000)):
        events = []
        for step in range(3):
            t = step * 20_000
            events += [_launch("cudaLaunchKernel", t, 5, 2 * step),
                       _kernel("sm90_xmma_gemm_bf16", t + 10, compute, 2 * step),
                       _launch("cudaLaunchKernel", t + 6, 5, 2 * step + 1),
                       _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", t + 10 + compute, 10_500 - compute,
                               2 * step + 1, stream=20)]
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(
            {"distributedInfo": {"rank": rank, "world_size": 2}, "traceEvents": events}))
    fb = analyze(tmp_path)
    assert fb.verdict == "fail" and fb.finding.startswith("rank 1 is the straggler")
    assert fb.numbers["straggler_rank"].value == 1 and set(fb.numbers) >= {"rank0_gpu_idle_pct", "rank1_gpu_idle_pct"}
    assert "rank1.json" in fb.next_probes[0]
    (tmp_path / "empty").mkdir()
    with pytest.raises(TraceFormatError, match="empty: no trace files"):
        analyze(tmp_path / "empty")
