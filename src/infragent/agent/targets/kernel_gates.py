"""The gates one kernel proposal passes, run in a child process (its own timeout and memory limit):
check against the reference → bench against the baseline (and the reference, when a criterion asks) →
roofline against the reference (evidence only: what work the candidate does, how near the machine's peak) →
every kernel criterion judged. The reference, the inputs and the baseline come from the baseline's copy of
the code, so a patch cannot move the goalposts; only the candidate comes from the proposal's folder.

    python -m infragent.agent.targets.kernel_gates SPEC --root DIR --baseline-root DIR --knobs JSON
        --baseline-knobs JSON --out RESULT.json
"""
from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable

from infragent.agent.targets.kernel_code import load_kernel_code
from infragent.lab.criteria import Judgement, judge_interval
from infragent.lab.spec import Criterion, Spec, load_spec
from infragent.probes.bench import DECIDE_CONFIDENCE, run_bench
from infragent.probes.check import run_check
from infragent.probes.feedback import Feedback
from infragent.probes.roofline import run_roofline

BENCH_BUDGET_S = 3.0
ROOFLINE_BUDGET_S = 0.5  # evidence for the report (work against the reference, share of peak), not a verdict
BENCH_CRITERIA = {"bench": "time_ratio", "bench_reference": "reference_time_ratio"}  # gate -> the metric it measures
GATE_OF = {"rel_error": "check", **{metric: gate for gate, metric in BENCH_CRITERIA.items()}}


def run_gates(spec: Spec, root: Path, baseline_root: Path, knobs: dict, baseline_knobs: dict) -> dict[str, Any]:
    """The gates in order, stopping at the first that fails; feedback per gate, judgements, objective."""
    base = load_kernel_code(spec.target, baseline_root, baseline_knobs)
    cand = load_kernel_code(spec.target, root, knobs)
    candidate = cand.bind(knobs)
    feedback: dict[str, Feedback] = {}

    def gate(name: str, probe: Callable[[], Feedback]) -> Feedback:
        started = time.monotonic()
        feedback[name] = probe()
        feedback[name].details["cost_s"] = round(time.monotonic() - started, 2)
        return feedback[name]

    if gate("check", lambda: run_check(candidate, base.reference, base.inputs, spec.target.partition, trials=12,
                                       rtol=spec.target.rtol)).verdict == "pass":
        gate("bench", lambda: run_bench(candidate, base.bind(baseline_knobs), base.bench_inputs,
                                        budget_s=BENCH_BUDGET_S, names=("candidate", "baseline")))
        if any(c.metric == "reference_time_ratio" for c in spec.criteria):
            gate("bench_reference", lambda: run_bench(candidate, base.reference, base.bench_inputs,
                                                      budget_s=BENCH_BUDGET_S, names=("candidate", "reference")))
        gate("roofline", lambda: run_roofline(candidate, base.bench_inputs, base.reference, quick_peaks=True,
                                              budget_s=ROOFLINE_BUDGET_S))
    judgements = [judge_kernel(c, feedback) for c in spec.criteria]
    for name, metric in BENCH_CRITERIA.items():
        if name in feedback:
            grade_bench(feedback[name], [j for j in judgements if j.metric == metric], metric)
    measured = feedback["bench"].numbers.get("ratio") if "bench" in feedback else None  # none: too busy to measure
    ratio = measured.value if measured is not None else None
    return {"feedback": {name: fb.to_dict() for name, fb in feedback.items()},
            "judgements": [asdict(j) for j in judgements],
            "objective": 1.0 / ratio if ratio else None,  # speedup over the baseline: higher is better
            "feasible": feedback["check"].verdict == "pass" and all(j.verdict == "pass" for j in judgements)}


def grade_bench(bench: Feedback, judged: list[Judgement], metric: str) -> Feedback:
    """Give a bench gate the verdict of the criteria that read its ratio, in place: its own verdict only says
    which way the time moved ("slower" is a fail there), while the gate is there for a criterion — a candidate
    expected to be slower (a more precise kernel) passes when the criterion's bound holds. The finding keeps the
    direction and adds each criterion's judgement; with no criterion on the ratio, it says it is informational."""
    bench.details["bench_verdict"], bench.details["direction"] = bench.verdict, bench.finding
    if not judged:
        bench.finding += f" (informational: no {metric} criterion; the trial's verdict does not rest on it)"
        return bench
    verdicts = {j.verdict for j in judged}
    bench.verdict = "fail" if "fail" in verdicts else "inconclusive" if "inconclusive" in verdicts else "pass"
    bench.details["decided_by"] = [j.metric for j in judged]
    bench.finding += "; " + "; ".join(j.message for j in judged)
    return bench


def judge_kernel(criterion: Criterion, feedback: dict[str, Feedback]) -> Judgement:
    """One kernel criterion from the gates' numbers: an error bound, or a time ratio's CI against its limit."""
    if criterion.metric == "rel_error":
        numbers = feedback["check"].numbers
        value = max((numbers[k].value for k in ("max_rel_err", "max_rel_err_partitioned") if k in numbers
                     and not math.isnan(numbers[k].value)), default=math.nan)
        if math.isnan(value):
            return Judgement("", criterion.metric, "kernel", "all", "fail", value, (value, value),
                             message=f"rel_error: nothing compared ({feedback['check'].finding[:200]})")
        lo = hi = value
        method = (f"worst over the check's {numbers['trials'].value:g} trials, unpartitioned and every shard"
                  if "max_rel_err_partitioned" in numbers else f"worst over the check's {numbers['trials'].value:g} trials")
        confidence = None
    else:
        bench = feedback.get("bench" if criterion.metric == "time_ratio" else "bench_reference")
        if bench is None or "ratio" not in bench.numbers:
            why = "the check failed first" if bench is None else bench.finding[:200]
            return Judgement("", criterion.metric, "kernel", "all", "inconclusive", math.nan, (math.nan, math.nan),
                             message=f"{criterion.metric}: not measured ({why})")
        m = bench.numbers["ratio"]
        value, lo, hi = m.value, m.ci_low, m.ci_high
        if bench.details.get("ratio_trusted") is False:  # the bench itself does not trust this interval
            return Judgement("", criterion.metric, "kernel", "all", "inconclusive", value, (lo, hi),
                             message=f"{criterion.metric} {value:.4g}: not judged, the bench does not trust it "
                                     f"({bench.finding[:240]})")
        method = f"paired candidate/{bench.locality.get('a', 'baseline')} time ratio, {m.n} pairs"
        confidence = bench.details.get("confidence", DECIDE_CONFIDENCE)
    judgement = judge_interval(criterion, value, lo, hi, "kernel")
    judgement.method, judgement.confidence = method, confidence
    rule = f"<= {criterion.max:g}" if criterion.max is not None else f">= {criterion.min:g}"
    if criterion.metric == "rel_error":  # an observed worst case, not an estimate: no interval to quote
        judgement.message = f"{criterion.metric} {value:.3g} ({method}) {rule}: {judgement.verdict}"
    else:
        judgement.message = (f"{criterion.metric} {value:.4g} [{lo:.4g}, {hi:.4g}] ({method}, {confidence:.0%} CI) "
                             f"{rule}: {judgement.verdict}")
    return judgement


def gates_argv(spec_path: Path, root: Path, baseline_root: Path, knobs: dict, baseline_knobs: dict,
               out: Path) -> list[str]:
    """The child's command line."""
    import sys

    return [sys.executable, "-m", "infragent.agent.targets.kernel_gates", str(spec_path), "--root", str(root),
            "--baseline-root", str(baseline_root), "--knobs", json.dumps(knobs),
            "--baseline-knobs", json.dumps(baseline_knobs), "--out", str(out)]


def main() -> None:
    """Run the gates and write the result JSON."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec")
    parser.add_argument("--root", required=True)
    parser.add_argument("--baseline-root", required=True)
    parser.add_argument("--knobs", default="{}")
    parser.add_argument("--baseline-knobs", default="{}")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    result = run_gates(load_spec(args.spec), Path(args.root), Path(args.baseline_root), json.loads(args.knobs),
                       json.loads(args.baseline_knobs))
    Path(args.out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
