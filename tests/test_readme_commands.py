"""The README's `infragent optimize <pack>` commands, run as written from a folder that is not the package's:
they finish, every trial reaches its gates (paths do not depend on the working folder), and the output names the
pack's true cause. Then the texts of the kernel loop: each finding states the number it sits beside, and a
verdict word agrees with its direction and with the criterion that decides it.
"""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infragent.agent.targets.kernel_gates import grade_bench, judge_kernel
from infragent.agent.targets.kernel_hypotheses import SETTLE
from infragent.agent.targets.kernel_target import decision, trial_finding
from infragent.analysis.stats import paired_ratio
from infragent.lab.spec import Criterion
from infragent.probes import bench as bench_probe
from infragent.probes.artifacts import artifact_dir, export_artifact_dir
from infragent.probes.check import run_check
from infragent.probes.feedback import Feedback, Measure

PACKS = Path(__file__).resolve().parents[1] / "src" / "infragent" / "scenarios"
PACK_NAMES = ["tp-precision", "kda-decode-padding", "kv-transfer-gil", "quant-gates"]


def infragent(*args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """The installed console script (what the README runs), from cwd; `python -m infragent.cli` without one."""
    script = Path(sys.executable).parent / "infragent"
    argv = [str(script)] if script.exists() else [sys.executable, "-m", "infragent.cli"]
    env = {k: v for k, v in os.environ.items() if k != "INFRAGENT_ARTIFACTS"}  # the default: under cwd
    return subprocess.run([*argv, *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


def ran_clean(run: subprocess.CompletedProcess) -> str:
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-4000:]
    assert "Traceback" not in out and "FileNotFoundError" not in out, out[-4000:]
    return out


@pytest.mark.parametrize("pack", PACK_NAMES)
def test_dry_run_prints_the_plan(pack: str, tmp_path: Path) -> None:
    out = ran_clean(infragent("optimize", pack, "--dry-run", cwd=tmp_path, timeout=120))
    assert "criterion" in out and "steps:" in out
    assert not (tmp_path / ".infragent").exists()  # a dry run writes nothing


# (pack, flags, what the output must say): the smallest budgets that reach what each line checks. The kernel
# ladders are 4 probe runs (5 with the GIL probe); a trial is 1-3 more. Measured here (2 cores, shared):
# tp-precision ~20 s, kda-decode-padding ~15 s, kv-transfer-gil ~90-120 s (its ladder only: 12 prefills of
# 600 ms per check trial; a trial would add ~2.5 min), quant-gates: see its test.


def best_fix_or_too_busy_to_time(out: str) -> bool:
    """tp-precision's best is a fix that passes the check (which of tf32x3 and bf16x3 is faster is a timing
    claim a busy machine may flip), or, on a machine too busy to time, no best: every fix's bench gate said
    "inconclusive: contended" rather than a ratio it could not trust."""
    if re.search(r"best: trial (1 \{'precision': 'tf32x3'\}|2 \{'precision': 'bf16x3'\})", out):
        return True
    benches = re.findall(r"\[trial/[12]/bench\] (\w+) .*", out)
    lines = [line for line in out.splitlines() if re.search(r"\[trial/[12]/bench\] ", line)]
    return ("no proposal beat the baseline" in out and len(benches) == 2 and set(benches) == {"INCONCLUSIVE"}
            and all("contended" in line for line in lines))


KERNEL_RUNS = [
    ("tp-precision", ["--budget-probes", "9", "--budget-minutes", "2"],
     ["shards 0, 1 of column:2 compute with bf16 operands", best_fix_or_too_busy_to_time,
      "[trial/0/check] FAIL", "[trial/2/check] PASS", "[trial/2/bench]"]),
    ("kda-decode-padding", ["--budget-probes", "6", "--budget-minutes", "1"],
     ["the FP32 work in kda.gate, kda.qk_norm is redone in every kda.v_tile: 4x per call",
      "kda.state does more FLOPs than the reference's (padded)", "[trial/0/check] PASS", "[trial/0/bench]"]),
    ("kv-transfer-gil", ["--budget-probes", "5", "--budget-minutes", "1"],
     ["thread kv-transfer is starved of the GIL", "gemm @ MainThread", "never overlap"]),
]


@pytest.mark.parametrize("pack, flags, words", KERNEL_RUNS, ids=[r[0] for r in KERNEL_RUNS])
def test_kernel_pack_command_from_another_folder(pack: str, flags: list[str], words: list[str],
                                                 tmp_path: Path) -> None:
    out = ran_clean(infragent("optimize", pack, *flags, cwd=tmp_path, timeout=400))
    for word in words:
        assert (word(out) if callable(word) else word in out), (word, out[-4000:])
    assert "did not finish" not in out  # no gates child died (it runs in the pack's folder, not here)
    assert (tmp_path / ".infragent" / "ledger.sqlite").exists()
    assert any((tmp_path / ".infragent" / "artifacts").iterdir())  # evidence lands under the cwd's .infragent
    if "[trial/0/" in words[-1]:
        assert list((tmp_path / ".infragent" / "gates").glob("run-1-0.json"))


def test_quant_gates_command_from_another_folder(tmp_path: Path) -> None:
    """The serving pack, with the smallest budget that reaches one proposal: the baseline trace and the A/A
    calibration (two probes, 1-3 minutes on 2 shared cores; the minutes budget does not cut them short) leave
    room for one trial only with 4 probes and 10 minutes. Its first proposal (seed 0) is W8A8 without
    SmoothQuant, which the README says fails the perplexity gate: the quality gates take 1-3 minutes."""
    # 18 minutes, under the suite's 20-minute watchdog: a slow run fails this test, not the whole suite
    out = ran_clean(infragent("optimize", "quant-gates", "--budget-probes", "4", "--budget-minutes", "10",
                              cwd=tmp_path, timeout=1080))
    assert "[trial/0/quality]" in out, out[-4000:]
    line = next(x for x in out.splitlines() if "[trial/0/quality]" in x)
    if "'quantization': 'w8a8'" in line:
        assert "FAIL" in line and "perplexity_increase" in line and "limit <= 0.01: fail" in line, line
    assert (tmp_path / ".infragent" / "ledger.sqlite").exists()


# ---- paths ----

def test_artifact_dir_is_absolute_and_exported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", "rel/arts")
    assert artifact_dir() == tmp_path / "rel" / "arts"
    monkeypatch.delenv("INFRAGENT_ARTIFACTS")
    assert artifact_dir() == tmp_path / ".infragent" / "artifacts"
    path = export_artifact_dir()
    assert os.environ["INFRAGENT_ARTIFACTS"] == str(path) and path.is_absolute()
    monkeypatch.chdir(tmp_path / ".infragent")
    assert artifact_dir() == path  # a child in another folder writes to the same place


# ---- texts ----

def _tp_kernel():
    spec = importlib.util.spec_from_file_location("tp_precision_kernel", PACKS / "tp-precision" / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _err(x: float) -> str:
    return f"{x:.1e}"


@pytest.fixture(scope="module")
def tp_checks():
    """The tp-precision pack's partitioned check on the wrong baseline (bf16) and on the fix (bf16x3)."""
    k = _tp_kernel()
    return {p: run_check(lambda x, w, p=p: k.linear(x, w, p), k.reference, k.inputs, "column:2", trials=8, rtol=1e-4)
            for p in ("bf16", "bf16x3")}


def test_failed_partitioned_check_states_the_number_it_records(tp_checks) -> None:
    fb = tp_checks["bf16"]
    worst = fb.numbers["max_rel_err_partitioned"].value
    assert fb.verdict == "fail"
    assert f"max rel err {_err(worst)} (worst over 8 trials, each shard and the combined output" in fb.finding
    for case in re.findall(r"; (\S+) on this case", fb.finding):  # a case's own error, when it differs, is named so
        assert float(case) <= worst


def test_hypothesis_cites_the_number_the_check_states(tp_checks) -> None:
    check = tp_checks["bf16"].to_dict()
    knobs = {}
    h = SETTLE["precision"]({"ladder/check": check}, knobs)
    assert "partitioned" in h.claim
    worst = check["numbers"]["max_rel_err_partitioned"]["value"]
    assert f"max rel err {_err(worst)} partitioned" in h.claim and f"max rel err {_err(worst)}" in check["finding"]
    assert h.cites["ladder/check:numbers/max_rel_err_partitioned/value"] == worst
    assert "worst over 8 trials" in h.claim


def test_passing_check_states_the_error_the_criterion_reads(tp_checks) -> None:
    fb = tp_checks["bf16x3"]
    assert fb.verdict == "pass"
    judged = judge_kernel(Criterion(metric="rel_error", max=1e-4), {"check": fb})
    worst = max(fb.numbers["max_rel_err"].value, fb.numbers["max_rel_err_partitioned"].value)
    assert judged.value == worst and judged.verdict == "pass"
    assert f"worst rel err {_err(worst)} over every trial, shard and combined output" in fb.finding
    assert f"rel_error {worst:.3g}" in judged.message and "CI" not in judged.message  # an observed worst, no CI


def _bench(a_ns: float, b_ns: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcome: str) -> Feedback:
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    gen = torch.Generator().manual_seed(0)
    noise = (torch.rand(40, generator=gen) * 0.01 + 1).tolist()
    result = bench_probe.BenchResult(a_ns=[a_ns * n for n in noise], b_ns=[b_ns for _ in noise],
                                    b_first=[False] * 40, outcome=outcome)
    result.ratio = paired_ratio(result.a_ns, result.b_ns, confidence=0.99)
    return bench_probe._feedback(result, "baseline", "candidate", False, bench_probe.Case(), bench_probe.BenchConfig())


def test_bench_direction_agrees_with_its_ratio(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slower = _bench(100.0, 250.0, tmp_path, monkeypatch, "slower")
    ratio = slower.numbers["ratio"].value
    assert ratio > 1 and slower.verdict == "fail"
    assert f"slower than baseline: x{ratio:.3f} [" in slower.finding and "the time per call" in slower.finding
    faster = _bench(100.0, 60.0, tmp_path, monkeypatch, "faster")
    ratio = faster.numbers["ratio"].value
    assert ratio < 1 and faster.verdict == "pass"
    assert f"faster than baseline: x{ratio:.3f} [" in faster.finding and f"{1 / ratio:.2f}x as fast" in faster.finding
    assert faster.details["confidence"] == 0.99


def test_an_expected_slowdown_within_its_criterion_passes_the_bench_gate(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    fb = _bench(100.0, 257.0, tmp_path, monkeypatch, "slower")
    judged = judge_kernel(Criterion(metric="time_ratio", max=8.0), {"bench": fb})
    m = fb.numbers["ratio"]
    assert (judged.value, judged.ci) == (m.value, (m.ci_low, m.ci_high)) and judged.verdict == "pass"
    assert "99% CI" in judged.message  # the bench's interval, not a default
    grade_bench(fb, [judged], "time_ratio")
    assert fb.verdict == "pass" and fb.details["bench_verdict"] == "fail"
    assert fb.finding.startswith("candidate is slower than baseline: x") and judged.message in fb.finding
    gates = {"feedback": {"check": {"probe": "check", "verdict": "pass", "finding": "ok"}, "bench": fb.to_dict()},
             "judgements": [{"metric": "time_ratio", "verdict": "pass", "message": judged.message}]}
    text = trial_finding(gates)
    assert text.startswith("every criterion passes ([bench] time_ratio pass)")
    assert "[bench] candidate is slower than baseline: x" in text and "within its time_ratio bound" in text
    assert decision(gates["judgements"]) == f"every criterion passes: [bench] {judged.message}"


def test_a_failed_criterion_fails_the_bench_gate_and_decides_the_trial(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    fb = _bench(100.0, 120.0, tmp_path, monkeypatch, "slower")
    judged = judge_kernel(Criterion(metric="time_ratio", max=0.9), {"bench": fb})
    grade_bench(fb, [judged], "time_ratio")
    assert judged.verdict == "fail" and fb.verdict == "fail"
    rel = {"metric": "rel_error", "verdict": "pass", "message": "rel_error 0 (worst) <= 1e-05: pass"}
    gates = {"feedback": {"bench": fb.to_dict()},
             "judgements": [rel, {"metric": "time_ratio", "verdict": "fail", "message": judged.message}]}
    assert decision(gates["judgements"]) == f"[bench] {judged.message}"  # only what decided it
    text = trial_finding(gates)
    assert text.startswith("not accepted ([bench] time_ratio fail)") and "outside its time_ratio bound" in text


def test_a_bench_no_criterion_reads_says_it_is_informational(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fb = _bench(100.0, 150.0, tmp_path, monkeypatch, "slower")
    grade_bench(fb, [], "time_ratio")
    assert fb.verdict == "fail" and "informational: no time_ratio criterion" in fb.finding


def test_a_ratio_the_bench_does_not_trust_is_not_judged() -> None:
    """On a busy machine with too few A/A pairs to widen by, the bench says "inconclusive: contended" and keeps
    the raw ratio; a criterion must not turn that untrusted number (1 pair: [69.1, 69.1]) into a FAIL."""
    bench = Feedback("bench", "inconclusive", "inconclusive: contended: other processes used 1.0 cores; ratio "
                     "69.107, not trusted", {"ratio": Measure(69.107, "x", 69.107, 69.107, 1)},
                     details={"outcome": "contended", "ratio_trusted": False})
    judged = judge_kernel(Criterion(metric="time_ratio", max=8.0), {"bench": bench})
    grade_bench(bench, [judged], "time_ratio")
    assert judged.verdict == "inconclusive" and "not judged" in judged.message and bench.verdict == "inconclusive"


def test_rel_error_with_nothing_compared_fails() -> None:
    check = Feedback("check", "inconclusive", "0/3 trials compared",
                     {"max_rel_err": Measure(math.nan), "trials": Measure(3)})
    judged = judge_kernel(Criterion(metric="rel_error", max=1e-4), {"check": check})
    assert judged.verdict == "fail" and "nothing compared" in judged.message


def test_gil_hypothesis_names_the_working_span_not_a_parent_that_also_never_overlaps() -> None:
    """Noise decides whether a parent (step) qualifies as never overlapping next to its leaf (gemm): the claim
    names the span with the most work of its own, and cites the pair it names."""
    never = [{"a": "kv.transfer @ kv-transfer", "b": f"{name} @ MainThread", "executing_share_of_a": share}
             for name, share in (("step", 0.037), ("attention", 0.0), ("gemm", 0.002))]
    trace = {"verdict": "fail", "finding": "...", "details": {"never_overlapping": never, "top_spans": [
        {"key": "gemm", "exclusive_ns": 1_500_000_000}, {"key": "attention", "exclusive_ns": 90_000_000},
        {"key": "step", "exclusive_ns": 10_000_000}]}}
    gil = {"verdict": "fail", "finding": "...", "locality": {"thread": "kv-transfer", "span": "kv.transfer"},
           "numbers": {"kv-transfer.waited": {"value": 80.0}}}
    h = SETTLE["gil"]({"ladder/trace": trace, "ladder/gil": gil}, {})
    assert "kv.transfer @ kv-transfer and gemm @ MainThread never overlap (0.2%" in h.claim
    assert h.cites == {"ladder/trace:details/never_overlapping/2/executing_share_of_a": 0.002,
                       "ladder/gil:numbers/kv-transfer.waited/value": 80.0}
    assert SETTLE["gil"]({"ladder/trace": trace}, {}) is None  # never overlapping alone is a question, not a cause
