"""A run read back from the ledger as the report's data: the headline (baseline against best, each criterion
judged with its CI, why the run stopped), one row per trial with its gates, the search's progress, the
operating points for the Pareto view, baseline and best latency CDFs, the baseline's trace, the hypothesis
chains, and the environment with each probe's contention flag. No HTML here (page.py draws it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infragent.lab.ledger import Ledger, charged
from infragent.lab.spec import Scenario, Spec, SpecError, load_spec
from infragent.lab.trajectory import best_of, chains
from infragent.probes.contention import WAIT_SHARE
from infragent.report.serving_views import (add_cdf_samples, loadgen_result, operating_point, pareto_front,
                                            stored_artifact)
from infragent.report.trace_view import TraceView, trace_view
from infragent.trace_model import TraceFormatError

TRACE_PROBES = ("analyze", "trace", "record")


@dataclass
class Headline:
    """Did it win, against which criteria, and why the run stopped."""

    kind: str  # "optimize" or "measure"
    baseline_knobs: dict[str, Any]
    best: dict[str, Any] | None  # trial, knobs, patch summary, finding
    judged: str  # whose criteria are shown: "best trial N", "closest trial N (no trial passed)", "baseline"
    trial: int | None = None  # the trial whose criteria (and evidence) are shown
    judgements: list[dict[str, Any]] = field(default_factory=list)
    objective: dict[str, Any] = field(default_factory=dict)  # baseline/best Measure dicts and their ratio
    stopped: str = ""


@dataclass
class RunReport:
    """Everything the page shows, as plain data."""

    run: dict[str, Any]
    environment: dict[str, Any]
    headline: Headline
    objective_label: str
    trials: list[dict[str, Any]] = field(default_factory=list)
    progress: list[dict[str, Any]] = field(default_factory=list)  # trial, objective, feasible, best_so_far
    points: list[dict[str, Any]] = field(default_factory=list)  # operating points: baseline and each trial
    slos_ms: dict[str, float] = field(default_factory=dict)  # ttft / tpot limits to draw
    cdfs: dict[str, dict[str, dict[str, list[float]]]] = field(default_factory=dict)  # metric -> group -> side
    trace: TraceView | None = None
    chains: list[dict[str, Any]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what could not be shown, and why


def run_report(ledger: Ledger, run_id: int, trace_path: str | Path | None = None) -> RunReport:
    """Read one run into the report's data (trace_path: a trace file to show instead of the run's own)."""
    run = ledger.run(run_id)
    environment = ledger.environment_data(run["environment_id"])
    results = ledger.probe_results(run_id)
    by_key = {r["key"]: r for r in results}
    trials = [_trial_row(c, by_key) for c in ledger.candidates(run_id)]
    spec = _spec(run)
    report = RunReport(run, environment or {}, _headline(ledger, run, trials, results, by_key),
                       _objective_label(spec, trials), trials, _progress(trials), chains=chains(ledger, run_id),
                       probes=[_probe_row(ledger, r) for r in results])
    if spec is None and run.get("spec_path"):
        report.notes.append(f"the spec {run['spec_path']} is no longer readable: SLO lines and bucket bounds are "
                            "left out")
    scenarios = {s.name: s for s in spec.scenarios} if spec else {}
    report.slos_ms = _slos(spec)
    _serving_evidence(report, ledger, by_key, scenarios)
    report.trace = _trace(ledger, results, trace_path, report.notes)
    return report


def _spec(run: dict[str, Any]) -> Spec | None:
    try:
        return load_spec(run["spec_path"]) if run.get("spec_path") else None
    except (SpecError, OSError):
        return None


def _trial_row(candidate: dict[str, Any], by_key: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One trial: what changed, each gate's verdict and cost, the objective with its CI, the outcome."""
    gates = []
    for key in candidate.get("records", []):
        r = by_key.get(key)
        if r is None or r["probe"] in ("loadgen",):
            continue  # the raw sides of an end-to-end run are its evidence, not a gate
        gates.append({"key": key, "gate": key.split("/", 2)[-1], "probe": r["probe"], "verdict": r["verdict"],
                      "cost_s": r["feedback"].get("details", {}).get("cost_s"), "finding": r["finding"],
                      "contended": _contended(r["feedback"])})
    e2e = by_key.get(f"trial/{candidate['trial']}/e2e")
    measure = (e2e or {}).get("feedback", {}).get("numbers", {}).get("objective_candidate") if e2e else None
    patch = candidate.get("patch") or ""
    return {"trial": candidate["trial"], "proposer": candidate.get("proposer", "search"),
            "hypothesis": candidate.get("hypothesis"), "knobs": candidate.get("knobs", {}),
            "patch": patch, "patch_summary": _patch_summary(patch) if patch else "",
            "status": candidate["status"], "feasible": bool(candidate.get("feasible")),
            "accepted": candidate["status"] == "measured" and bool(candidate.get("feasible")),
            "objective": candidate.get("objective"), "objective_ratio": candidate.get("objective_ratio"),
            "objective_ci": [measure.get("ci_low"), measure.get("ci_high")] if isinstance(measure, dict) else None,
            "why": candidate.get("why", ""), "gates": gates, "judgements": candidate.get("judgements", []),
            "cost_s": sum(g["cost_s"] or 0 for g in gates),
            "node": candidate.get("node")}  # the Ray node that measured it, twin baseline included (None: here)


def _patch_summary(patch: str) -> str:
    files = [line[6:] for line in patch.splitlines() if line.startswith("+++ b/")]
    added = sum(1 for line in patch.splitlines() if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in patch.splitlines() if line.startswith("-") and not line.startswith("---"))
    return f"patch +{added} -{removed} in {', '.join(files) or 'no file'}"


def _headline(ledger: Ledger, run: dict[str, Any], trials: list[dict[str, Any]], results: list[dict[str, Any]],
              by_key: dict[str, dict[str, Any]]) -> Headline:
    if run["kind"] != "optimize":
        judgements = [j for r in results if r["probe"] == "criterion"
                      for j in r["feedback"].get("details", {}).get("judgements", [])]
        return Headline(run["kind"], {}, None, "baseline", None, judgements, stopped=run.get("note") or "")
    best, limits = best_of(trials)
    baseline = ledger.experiment_knobs(run["id"], "baseline") or {}
    stopped = "" if run["status"] == "running" else run.get("note") or "; ".join(limits)
    if best is not None:
        shown, judged = best, f"best: trial {best['trial']}" + (
            f" (ranked by its gain over its own twin on {best['node']})" if best.get("node") else "")
    else:
        measured = [t for t in trials if t["judgements"]]
        shown = min(measured, key=lambda t: (sum(j["verdict"] == "fail" for j in t["judgements"]),
                                             math.inf if t["objective"] is None else -t["objective"]), default=None)
        judged = (f"closest: trial {shown['trial']} (no trial passed every criterion"
                  + ("" if run["status"] == "running" else "; the baseline is kept") + ")" if shown else
                  "run in progress: no trial judged end to end yet" if run["status"] == "running" else
                  "no trial reached an end-to-end judgement; the baseline is kept")
    objective = {}
    if shown is not None and (e2e := by_key.get(f"trial/{shown['trial']}/e2e")):
        numbers = e2e["feedback"].get("numbers", {})
        objective = {k: numbers[k] for k in ("objective_baseline", "objective_candidate", "objective_ratio")
                     if isinstance(numbers.get(k), dict)}
    summary = None if best is None else {k: best[k] for k in ("trial", "knobs", "patch_summary", "why")}
    return Headline("optimize", baseline, summary, judged, shown["trial"] if shown else None,
                    shown["judgements"] if shown else [], objective, stopped)


def _objective_label(spec: Spec | None, trials: list[dict[str, Any]]) -> str:
    if any(j.get("phase") == "kernel" for t in trials for j in t["judgements"]):
        return "speed vs the baseline (1 / time ratio; higher is better)"
    if spec is not None and spec.scenarios and spec.scenarios[0].goodput_ms:
        return f"goodput of {spec.scenarios[0].name} (req/s within its SLOs)"
    return "output throughput (tok/s)" if spec is None or spec.scenarios else "objective"


def _progress(trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    best = -math.inf
    rows = []
    for t in trials:
        value = t["objective"]
        if value is not None and t["accepted"]:
            best = max(best, value)
        rows.append({"trial": t["trial"], "objective": value, "feasible": t["accepted"],
                     "best_so_far": best if math.isfinite(best) else None})
    return rows


def _slos(spec: Spec | None) -> dict[str, float]:
    if spec is None or not spec.scenarios:
        return {}
    slos = {f"{k}_p99_ms" if k != "e2el" else "e2el_ms": v for k, v in spec.scenarios[0].goodput_ms.items()}
    for c in spec.criteria:
        if c.scenario in ("", spec.scenarios[0].name) and c.max is not None and c.metric in ("ttft_p99_ms",
                                                                                          "tpot_p99_ms"):
            slos[c.metric] = min(slos.get(c.metric, math.inf), c.max)
    return slos


def _serving_evidence(report: RunReport, ledger: Ledger, by_key: dict[str, dict[str, Any]],
                      scenarios: dict[str, Scenario]) -> None:
    """The shown trial's and its baseline's CDFs, and each trial's operating point, from the loadgen records."""
    shown = report.headline.trial
    label = "best" if report.headline.best is not None else "closest"
    first = next(iter(scenarios), None)
    feasible = {t["trial"]: t["accepted"] for t in report.trials}
    for key, r in by_key.items():
        if r["probe"] != "loadgen":
            continue
        parts = key.split("/")
        if parts[0] == "trial" and len(parts) == 4 and parts[1].isdigit():
            trial, scenario, side = int(parts[1]), parts[2], parts[3]
        elif report.run["kind"] != "optimize":
            trial, scenario, side = None, parts[0], "baseline"
        else:
            continue
        if trial is not None and trial != shown and (side != "candidate" or scenario != (first or scenario)):
            continue  # only the shown trial's sides are drawn; every trial's candidate is a point
        result = loadgen_result(ledger, r["feedback"])
        if result is None:
            report.notes.append(f"{key}: its raw records are not in the ledger's artifacts")
            continue
        if trial is None or trial == shown:
            buckets = tuple(scenarios[scenario].buckets) if scenario in scenarios else None
            add_cdf_samples(report.cdfs, result, scenario, label if side == "candidate" else "baseline", buckets)
        if trial is None or scenario != (first or scenario) or (point := operating_point(result)) is None:
            continue
        if side == "candidate":
            report.points.append({"trial": trial, "side": "trial", "feasible": feasible.get(trial, False), **point})
        elif trial == shown:
            report.points.append({"trial": trial, "side": "baseline", "feasible": True, **point})
    for point in pareto_front([p for p in report.points if p["side"] == "trial"], "ttft_p99_ms", "output_tok_s"):
        point["front_ttft"] = True
    for point in pareto_front([p for p in report.points if p["side"] == "trial"], "tpot_p99_ms", "output_tok_s"):
        point["front_tpot"] = True


def _trace(ledger: Ledger, results: list[dict[str, Any]], trace_path: str | Path | None,
           notes: list[str]) -> TraceView | None:
    """The trace given, else the run's first traced probe (the baseline's: the diagnosis traces first)."""
    if trace_path:
        return trace_view(trace_path, str(trace_path))
    for r in results:
        if r["probe"] not in TRACE_PROBES:
            continue
        for evidence in r["feedback"].get("evidence", []):
            if "trace" not in evidence.get("description", "") or "analysis" in evidence.get("description", ""):
                continue
            path = stored_artifact(ledger, evidence)
            if path is None:
                notes.append(f"{r['key']}: its trace {evidence.get('path')} is not in the ledger's artifacts")
                continue
            try:
                return trace_view(path, r["key"], stored=True)
            except (TraceFormatError, ValueError, OSError) as err:
                notes.append(f"{r['key']}: its trace could not be read ({str(err)[:200]})")
    return None


def _contended(feedback: dict[str, Any]) -> bool:
    """Whether the probe says the machine was busy while it measured."""
    details = feedback.get("details", {})
    contention = details.get("contention")
    return bool((isinstance(contention, dict) and contention.get("contended")) or details.get("contended")
                or (details.get("wait_share") or 0.0) > WAIT_SHARE or "contended" in feedback.get("finding", ""))


def _probe_row(ledger: Ledger, r: dict[str, Any]) -> dict[str, Any]:
    details = r["feedback"].get("details", {})
    return {"key": r["key"], "probe": r["probe"], "verdict": r["verdict"], "finding": r["finding"],
            "cost_s": details.get("cost_s"), "charged": charged(r["feedback"]), "contended": _contended(r["feedback"]),
            "node": details.get("node"),  # the Ray node that measured it (None: the driver's machine)
            "evidence": [{"path": ev.get("path"), "sha256": ev.get("sha256"), "description": ev.get("description", ""),
                          "stored": str(p) if (p := stored_artifact(ledger, ev)) else None}
                         for ev in r["feedback"].get("evidence", [])]}
