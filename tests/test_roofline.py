"""The roofline probe: FLOP/byte counts, per-machine peak cache, classification, and redundant-work detection."""
from __future__ import annotations

import json

import pytest
import roofline_cases as rc
import torch
from torch.utils.flop_counter import FlopCounterMode

from infragent.probes.work import count_work, kda_decode_step_bytes, kda_decode_step_flops, work_of
from infragent.analysis.stats import Summary
from infragent.engine.models.kda_ops import kda_decode_step
from infragent.probes import machine
from infragent.probes.inputs import Case, draw
from infragent.probes.machine import Peaks, machine_key, machine_peaks
from infragent.probes.roofline import classify, measure_roofline, run_roofline, to_feedback

FAST = dict(budget_s=0.05)


def fake_peaks(threads: int | None = None, quick: bool = False) -> Peaks:
    """Round, fixed roofs: 100 GFLOP/s, 10 GB/s (ridge 10 FLOP/B), 2 µs per torch op."""
    threads = threads or torch.get_num_threads()
    return Peaks(matmul_fp32_gflops=100.0, copy_bytes_per_s=10e9, gemv_fp32_bytes_per_s=8e9, op_floor_s=2e-6,
                 threads=threads, quick=quick, key=machine_key(threads))


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Every test gets its own empty peaks cache and no forced re-measure."""
    monkeypatch.setenv("INFRAGENT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("INFRAGENT_REMEASURE", raising=False)
    return tmp_path / "cache"


# ---- redundant work: the planted V-padded KDA decode step ---------------------------------------------------

DK, DV, DV_PAD = 64, 96, 128


def kda_step_flops_by_hand(dk: int, dv: int, tiles: int = 1) -> int:
    """FLOPs of one (batch, head) of kda_decode_step, op by op; q/k/gate work repeats once per V tile."""
    per_tile_qk_gate = (2 * 2 * dk  # q.q and k.k: a multiply and an add per element
                        + 2 * 2  # + eps and rsqrt, for q and for k
                        + 2 * dk  # q, k *= rsqrt
                        + dk)  # exp(g)
    per_v_column = (dk  # S *= exp(g)
                    + 2 * dk  # u = k^T S
                    + 2  # u = (v - u) * beta
                    + 2 * dk  # S += k u^T
                    + 2 * dk  # o = q^T S
                    + 1)  # o *= scale
    return tiles * per_tile_qk_gate + dv * per_v_column


def test_hand_count_is_the_closed_form():
    assert kda_step_flops_by_hand(DK, DV) == 7 * DK * DV + 3 * DV + 7 * DK + 4
    assert kda_decode_step_flops(3, 5, DK, DV) == 3 * 5 * (7 * DK * DV + 3 * DV + 7 * DK + 4)


def test_padded_kda_step_redundant_fraction_matches_hand_count():
    factory = rc.kda_shaped(2, 3, DK, DV)
    q, k, v, g, beta, state = draw(factory, 0).args
    want_state, got_state = state.clone(), state.clone()
    want_o = kda_decode_step(q, k, v, g, beta, want_state)
    got_o = rc.kda_step_padded(q, k, v, g, beta, got_state)
    torch.testing.assert_close(got_o, want_o)  # the padding is inert: same answer, more work
    torch.testing.assert_close(got_state, want_state)

    fb = run_roofline(rc.kda_step_padded, factory, reference=rc.kda_step, peaks=fake_peaks(), **FAST)
    # dv-proportional terms shrink by 96/128; the q/k normalization and gate (7*dk + 4) are not padded.
    by_hand = 1 - (7 * 64 * 96 + 3 * 96 + 7 * 64 + 4) / (7 * 64 * 128 + 3 * 128 + 7 * 64 + 4)
    assert by_hand == 1 - kda_step_flops_by_hand(DK, DV) / kda_step_flops_by_hand(DK, DV_PAD)
    got = fb.numbers["redundant_flop_fraction"].value
    assert got == pytest.approx(by_hand, rel=1e-12)
    assert abs(got - (1 - 96 / 128)) > 1e-3  # not the naive V ratio: the dv-independent terms count
    assert fb.numbers["flops"].value == 2 * 3 * kda_step_flops_by_hand(DK, DV_PAD)
    assert fb.details["counts"]["source"] == "counted"  # the padded kernel was run and counted, not looked up
    assert fb.details["reference_counts"]["source"] == "formula:kda_decode_step"
    assert f"{by_hand:.1%} of FLOPs redundant" in fb.finding
    assert "(dimension 96 → 128)" in fb.finding and "1 → 128" not in fb.finding  # the padded V dimension, named


def test_v_tiled_kda_step_also_counts_recomputed_qk_and_gate():
    tiles = DV_PAD // 32
    fb = run_roofline(rc.kda_step_vtiled, rc.kda_shaped(1, 2, DK, DV), reference=rc.kda_step,
                      peaks=fake_peaks(), **FAST)
    by_hand = 1 - (7 * 64 * 96 + 3 * 96 + 7 * 64 + 4) / (7 * 64 * 128 + 3 * 128 + tiles * (7 * 64 + 4))
    assert fb.numbers["redundant_flop_fraction"].value == pytest.approx(by_hand, rel=1e-12)


def test_kda_formula_matches_what_the_kernel_runs():
    """If kda_decode_step changes its ops, the registered formula must change with it."""
    B, H = 2, 3
    case = draw(rc.kda_shaped(B, H, DK, DV), 0)
    counted = count_work(kda_decode_step, case)
    assert counted.flops == kda_decode_step_flops(B, H, DK, DV)
    assert counted.bytes == kda_decode_step_bytes(B, H, DK, DV)
    assert counted.parts["matmul_inplace"] == 2 * B * H * DK * DV  # the baddbmm_ FlopCounterMode misses
    assert not counted.uncounted_ops
    assert work_of(kda_decode_step, case).source == "formula:kda_decode_step"


def test_flop_counter_matmul_is_2mkn():
    M, K, N = 64, 48, 32
    a, b = torch.randn(M, K), torch.randn(K, N)
    with FlopCounterMode(display=False) as counter:
        torch.mm(a, b)
    assert counter.get_total_flops() == 2 * M * K * N
    work = count_work(torch.mm, Case(args=(a, b)))
    assert work.flops == work.parts["matmul"] == 2 * M * K * N
    assert work.bytes == 4 * (M * K + K * N + M * N)


def test_explicit_counts_override_and_useful_flops_give_redundancy():
    fb = run_roofline(torch.add, rc.tiny_add_inputs, flops=8, useful_flops=2, peaks=fake_peaks(), **FAST)
    assert fb.details["counts"]["source"] == "given"
    assert fb.numbers["flops"].value == 8
    assert fb.numbers["redundant_flop_fraction"].value == pytest.approx(0.75)


# ---- classification ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, factory, bound", [
    (torch.mm, rc.matmul_inputs, "compute-bound"),
    (torch.add, rc.large_add_inputs, "memory-bound"),
    (rc.copy_into, rc.large_copy_inputs, "memory-bound"),
    (torch.add, rc.tiny_add_inputs, "overhead-bound"),
])
def test_classification_against_fixed_peaks(fn, factory, bound):
    fb = run_roofline(fn, factory, peaks=fake_peaks(), **FAST)
    assert fb.details["bound"] == bound
    assert f"{bound}:" in fb.finding
    assert fb.verdict in ("pass", "inconclusive")
    assert fb.numbers["time_us"].ci_low <= fb.numbers["time_us"].value <= fb.numbers["time_us"].ci_high
    assert fb.numbers["pct_of_peak"].value > 0


def test_classification_against_measured_quick_peaks():
    peaks = machine_peaks(quick=True)
    assert peaks.matmul_fp32_gflops > 1 and peaks.copy_bytes_per_s > 1e8 and 0 < peaks.op_floor_s < 1e-3
    for fn, factory, bound in [(torch.mm, rc.matmul_inputs, "compute-bound"),
                               (torch.add, rc.tiny_add_inputs, "overhead-bound")]:
        assert measure_roofline(fn, factory, peaks=peaks, **FAST).classification.bound == bound


def test_rule_picks_the_largest_roof_time():
    from infragent.probes.work import WorkCount

    peaks = fake_peaks()
    assert classify(WorkCount(flops=1e9, bytes=1e6, source="given", ops=1), 0.02, peaks).bound == "compute-bound"
    assert classify(WorkCount(flops=1e6, bytes=1e9, source="given", ops=1), 0.2, peaks).bound == "memory-bound"
    c = classify(WorkCount(flops=1e3, bytes=1e4, source="given", ops=20), 8e-5, peaks)
    assert c.bound == "overhead-bound" and c.pct_of_peak == pytest.approx(20 * 2e-6 / 8e-5)


def test_noisy_timing_is_inconclusive():
    result = measure_roofline(torch.add, rc.tiny_add_inputs, peaks=fake_peaks(), **FAST)
    result.time = Summary(center=1e-5, lo=0.5e-5, hi=2e-5, n=5)
    fb = to_feedback(result, max_rel_ci=0.2)
    assert fb.verdict == "inconclusive" and "noisy" in fb.finding


# ---- the per-machine peaks cache ------------------------------------------------------------------------------

def test_peaks_are_cached_per_machine(monkeypatch, cache_dir):
    calls = []

    def measure(threads=None, quick=False):
        calls.append((threads, quick))
        return fake_peaks(threads, quick)

    monkeypatch.setattr(machine, "measure_peaks", measure)
    first = machine_peaks(threads=2)
    assert machine_peaks(threads=2) == first and len(calls) == 1  # second call reads the cache
    cached = json.loads(next(cache_dir.glob("peaks-*.json")).read_text())
    assert cached["key"]["threads"] == 2 and cached["key"]["torch"] == torch.__version__

    machine_peaks(threads=1)  # another thread count is another machine key
    machine_peaks(threads=2, quick=True)  # quick numbers never stand in for full ones
    assert len(calls) == 3
    monkeypatch.setattr(machine, "cpu_model", lambda: "Some Other CPU")
    machine_peaks(threads=2)
    assert len(calls) == 4
    machine_peaks(threads=2)
    assert len(calls) == 4

    machine_peaks(threads=2, remeasure=True)
    monkeypatch.setenv("INFRAGENT_REMEASURE", "1")
    machine_peaks(threads=2)
    assert len(calls) == 6


def test_contended_peaks_are_remeasured_once_quiet(monkeypatch):
    calls = []

    def measure(threads=None, quick=False):
        calls.append(1)
        return Peaks(**{**fake_peaks(threads, quick).to_dict(), "others_cores": 1.5})

    monkeypatch.setattr(machine, "measure_peaks", measure)
    monkeypatch.setattr(machine, "others_cores_now", lambda: 1.5)
    machine_peaks(threads=2)
    machine_peaks(threads=2)
    assert len(calls) == 1  # still busy: the contended numbers are the best there are
    monkeypatch.setattr(machine, "others_cores_now", lambda: 0.0)
    machine_peaks(threads=2)
    assert len(calls) == 2


def test_cli_roofline(monkeypatch):
    from typer.testing import CliRunner

    from infragent.cli import app

    monkeypatch.setattr(machine, "measure_peaks", fake_peaks)
    monkeypatch.setattr(rc, "kda_inputs", rc.kda_shaped(1, 2, DK, DV))
    result = CliRunner().invoke(app, ["roofline", "roofline_cases:kda_step_padded", "--inputs",
                                      "roofline_cases:kda_inputs", "--reference", "roofline_cases:kda_step", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["probe"] == "roofline" and data["numbers"]["redundant_flop_fraction"]["value"] > 0.2
