"""The end of an optimize run, as text: baseline against best per criterion with CIs, what limited the
result, and where the HTML report is."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from infragent.agent.context import Budget
from infragent.agent.core import Outcome, optimize
from infragent.lab.criteria import describe
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Executor
from infragent.lab.lifecycle import interrupt_on_sigterm
from infragent.report.run_page import write_report


def summary_lines(outcome: Outcome) -> list[str]:
    """Baseline vs best; per criterion (phase, bucket) its estimate, CI, limit and verdict; the limits; the
    hypotheses tested."""
    lines = [f"run {outcome.run_id}: {len(outcome.trials)} proposals, "
             f"{sum(t['status'] == 'measured' for t in outcome.trials)} measured end to end"]
    lines.append(f"baseline knobs: {outcome.baseline['knobs']}")
    best = outcome.best
    if best is None:
        lines.append("no proposal beat the baseline within the criteria; keeping the baseline")
    else:
        lines.append(f"best: trial {best['trial']} {best['knobs']} -> {best['finding']}")
        if best.get("node") and best.get("objective_ratio") is not None:
            lines.append(f"  ranked by its gain over its own twin baseline on {best['node']}: "
                         f"objective x{best['objective_ratio']:.3f}")
        for j in best.get("judgements", []):
            if j["phase"] == "kernel" and not j.get("method"):
                j = {**j, "method": "paired bench ratio" if "ratio" in j["metric"]
                     else "worst over the check's trials and shards"}
            where = f"{j['metric']} [{j['phase']}, bucket {j['bucket']}]"
            lines.append(f"  {j['verdict'].upper():4s} {where} {describe(j)}")
    for limit in outcome.limits:
        lines.append(f"limited by: {limit}")
    for h in outcome.hypotheses[:6]:
        said = f" by {h.settled_by}" if h.settled_by else f" (probe {h.probe}; {h.predicted})"
        lines.append(f"hypothesis {h.key} {h.status}{said}: {h.claim}")
    return lines


def run_optimize(spec_path: str | Path, ledger_path: str | Path, budget: Budget, resume: int | None = None,
                 proposer: Any = None, feedback: str = "ladder", executor: Executor | None = None) -> Outcome:
    """Run the loop, print its trajectory and summary, write the report.

    proposer: None for the search proposer, or another (playbook, llm, command)."""
    ledger = Ledger(ledger_path)
    interrupt_on_sigterm()
    try:
        outcome = optimize(spec_path, ledger, budget, proposer, resume, feedback=feedback, executor=executor)
    except KeyboardInterrupt:
        raise SystemExit(130) from None  # the run's note (what was stopped, how to resume) is already printed
    print()
    for line in summary_lines(outcome):
        print(line)
    try:
        report = write_report(ledger, outcome.run_id, ledger.home / f"report-run-{outcome.run_id}.html")
        print(f"report: {report}")
    except Exception as err:  # noqa: BLE001 (the run is recorded; a page that cannot be drawn must not hide it)
        print(f"report: not written ({type(err).__name__}: {str(err)[:300]}); "
              f"`infragent report {outcome.run_id} --ledger {ledger.location}` tries again")
    print(f"trajectory: infragent show {outcome.run_id} --ledger {ledger.location}")
    return outcome
