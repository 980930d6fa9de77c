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


def _direction(fb, expected: str) -> None:  # noqa: ANN001 - a bench Feedback
    """The expected direction, or on a busy machine an honest 'inconclusive: contended' (the signals in its
    details say so): never the opposite direction, never 'no change'."""
    if fb.details["outcome"] == "contended":
        assert fb.verdict == "inconclusive" and fb.finding.startswith("inconclusive: contended"), fb.finding
        assert fb.details["contention"]["contended"]
        return
    assert fb.details["outcome"] == expected, fb.finding
    ratio = fb.numbers["ratio"]
    assert (ratio.ci_low > 1) if expected == "slower" else (ratio.ci_high < 1)


def test_a_doubled_workload_is_slower_and_its_inverse_faster():
    slower = run_bench(bench_cases.twice, bench_cases.work, config=BenchConfig(budget_s=2.0))
    _direction(slower, "slower")  # exactly 2x the work; how close to 2, busy or not: benchmarks/bench_contended.py
    assert slower.verdict == ("fail" if slower.details["outcome"] == "slower" else "inconclusive")
    faster = run_bench(bench_cases.work, bench_cases.twice, config=BenchConfig(budget_s=2.0))
    _direction(faster, "faster")
    assert faster.details["outcome"] == "contended" or (faster.verdict == "pass" and "faster" in faster.finding)


def test_a_call_the_machine_made_contended_names_why_though_the_busy_spell_ended(monkeypatch):
    from infragent.probes import bench
    from infragent.probes.contention import Contention

    class SpellThenQuiet:  # busy when first read (others' CPU at 1.5 cores), quiet over the whole window after
        readings = iter([Contention(0.02, 0.0, 1.5, 0.3)])

        def now(self) -> Contention:
            return next(self.readings, Contention(0.02, 0.0, 0.1, 2.0))

        def count_threads(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(bench, "ContentionWatch", SpellThenQuiet)
    fb = run_bench(bench_cases.twice, bench_cases.work, config=BenchConfig(budget_s=2.0))
    contention = fb.details["contention"]
    assert contention["contended"] and contention["others_cores"] == 1.5, contention
    assert "contended by other processes: they used 1.5 cores;" in fb.finding, fb.finding  # decided or not
    assert fb.next_probes[0].startswith("bench again once the machine is quiet"), fb.next_probes


def test_a_over_a_finds_no_change_and_reports_the_noise_floor():
    aa = run_bench(bench_cases.work, bench_cases.work_copy, config=BenchConfig(budget_s=2.0))
    assert aa.details["outcome"] in ("no_change", "undecided", "contended")  # never a false "faster"/"slower"
    alone = run_bench(bench_cases.work, config=BenchConfig(budget_s=2.0))
    assert "noise floor" in alone.finding
    floor = alone.numbers["min_detectable_effect"].value
    if floor != floor:  # a busy machine left too few (long) pairs for an interval: said, never shown as ±0
        assert alone.details["outcome"] == "contended" and "noise floor unknown" in alone.finding, alone.finding
    else:
        assert floor > 0  # a measured width, not a placeholder (its size: benchmarks/)


def test_raw_samples_are_kept_and_hashed():
    fb = run_bench(bench_cases.work, bench_cases.work_copy, config=BenchConfig(budget_s=1.0))
    raw = fb.details["raw"]
    assert len(raw["a_ns"]) == len(raw["b_ns"]) == fb.details["pairs"]
    assert fb.details["pairs"] >= 30 or fb.details["outcome"] == "contended"  # busy: fewer, longer samples
    evidence = fb.evidence[0]
    data = Path(evidence.path).read_bytes()
    assert hashlib.sha256(data).hexdigest() == evidence.sha256
    assert json.loads(data)["a_ns"] == raw["a_ns"]
    assert json.loads(fb.to_json())["probe"] == "bench"


def test_measuring_stops_at_the_budget():
    fb = run_bench(bench_cases.work, config=BenchConfig(budget_s=0.3, equivalence=0.0))  # can never decide A/A
    raw, inner = fb.details["raw"], fb.details["inner"]
    pairs = list(zip(raw["a_ns"], raw["b_ns"])) + [tuple(p) for p in raw["aa_ns"]]
    longest_pair_s = max((a + b for a, b in pairs), default=0.0) * inner / 1e9
    # the A/A can never decide, so only the budget (or a busy machine) ended it; a pair starts only if the last
    # one's time still fits: it ends about one pair past the budget (twice both, for what runs between pairs)
    assert fb.details["budget_hit"] or fb.details["outcome"] == "contended"
    assert fb.numbers["measuring_s"].value <= 2 * (0.3 + longest_pair_s)


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
