"""The bench probe: paired A/B verdicts, A/A noise floor, calibration, raw samples kept as evidence."""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench_cases
from infragent.probes.bench import BenchConfig, calibrate, run_bench, _cpu_timer


@pytest.fixture(autouse=True)
def _artifacts(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))


def test_a_doubled_workload_is_slower_and_its_inverse_faster():
    slower = run_bench(bench_cases.twice, bench_cases.work, config=BenchConfig(budget_s=2.0))
    assert slower.details["outcome"] == "slower" and slower.verdict == "fail"
    assert slower.numbers["ratio"].ci_low > 1  # exactly 2x the work: figures in benchmarks/bench_contended.py
    faster = run_bench(bench_cases.work, bench_cases.twice, config=BenchConfig(budget_s=2.0))
    assert faster.details["outcome"] == "faster" and faster.verdict == "pass"
    assert "faster" in faster.finding


def test_a_over_a_finds_no_change_and_reports_the_noise_floor():
    aa = run_bench(bench_cases.work, bench_cases.work_copy, config=BenchConfig(budget_s=2.0))
    assert aa.details["outcome"] in ("no_change", "undecided")  # never a false "faster"/"slower" claim
    alone = run_bench(bench_cases.work, config=BenchConfig(budget_s=2.0))
    assert "noise floor" in alone.finding
    floor = alone.numbers["min_detectable_effect"].value
    assert floor > 0 and floor == floor  # a measured width, not a placeholder (its size: benchmarks/)


def test_raw_samples_are_kept_and_hashed():
    fb = run_bench(bench_cases.work, bench_cases.work_copy, config=BenchConfig(budget_s=1.0))
    raw = fb.details["raw"]
    assert len(raw["a_ns"]) == len(raw["b_ns"]) == fb.details["pairs"] >= 30
    evidence = fb.evidence[0]
    data = Path(evidence.path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == evidence.sha256
    assert json.loads(data)["a_ns"] == raw["a_ns"]
    assert json.loads(fb.to_json())["probe"] == "bench"


def test_measuring_stops_at_the_budget():
    fb = run_bench(bench_cases.work, config=BenchConfig(budget_s=0.3, equivalence=0.0))  # can never decide A/A
    raw, inner = fb.details["raw"], fb.details["inner"]
    longest_pair_s = max(a + b for a, b in zip(raw["a_ns"], raw["b_ns"])) * inner / 1e9
    # the A/A can never decide, so only the budget ended it; a pair starts only if the last one's time still
    # fits, so it ends about one pair past the budget (twice both, for what runs between pairs on a busy machine)
    assert fb.details["budget_hit"] and fb.numbers["measuring_s"].value <= 2 * (0.3 + longest_pair_s)


def test_calibration_batches_tiny_calls():
    inner = calibrate(lambda: None, _cpu_timer, min_sample_s=0.0005)
    assert inner >= 64


def test_cli_bench_with_an_inputs_factory(tmp_path):
    tests = Path(__file__).parent
    src = tests.parent / "src"
    out = subprocess.run([sys.executable, "-m", "infragent.cli", "bench", "bench_cases:tiny", "--inputs",
                          "bench_cases:tiny_inputs", "--budget-s", "0.5", "--json"], cwd=tests,
                         capture_output=True, text=True, env={"PYTHONPATH": str(src), "INFRAGENT_ARTIFACTS": str(tmp_path),
                                                              "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["probe"] == "bench" and data["locality"]["a"] == "bench_cases:tiny"
    bad = subprocess.run([sys.executable, "-m", "infragent.cli", "bench", "bench_cases:nope"], cwd=tests,
                         capture_output=True, text=True, env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2 and "no attribute 'nope'" in bad.stderr
