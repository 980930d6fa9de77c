"""A run's trajectory read back from the ledger, as data: each hypothesis's chain (hypothesis → the probe
that settled it → its verdict → the decisions taken on it: candidates that tested it and their outcome), and
how many probe runs it took to settle a hypothesis. Rendering is the caller's (show, report).
"""
from __future__ import annotations

import math
from typing import Any

from infragent.lab.ledger import Ledger, charged


def chains(ledger: Ledger, run_id: int) -> list[dict[str, Any]]:
    """One chain per hypothesis, in the order they were posed."""
    probes = {r["key"]: r for r in ledger.probe_results(run_id)}
    candidates = ledger.candidates(run_id)
    out = []
    for h in ledger.hypotheses(run_id):
        probe = probes.get(h.get("settled_by") or "")
        tested = [c for c in candidates if c.get("hypothesis") == h["key"]]
        out.append({"key": h["key"], "claim": h["claim"], "probe": h["probe"], "predicted": h["predicted"],
                    "status": h["status"], "settled_by": h.get("settled_by") or None,
                    "probe_verdict": probe["verdict"] if probe else None,
                    "probe_finding": probe["finding"] if probe else None,
                    "candidates": [{"trial": c["trial"], "status": c["status"], "feasible": c["feasible"],
                                    "why": c["why"]} for c in tested],
                    "decision": decision(h, tested)})
    return out


def decision(hypothesis: dict[str, Any], tested: list[dict[str, Any]]) -> str:
    """What the loop did with a hypothesis, in words."""
    accepted = [c for c in tested if c["status"] == "measured" and c["feasible"]]
    if accepted:
        return f"accepted trial {accepted[0]['trial']} on it"
    status = hypothesis["status"]
    if status == "refuted":
        return "closed: no change is proposed on it again"
    if status == "supported":
        return "focus: proposals go to its locality" + (f" ({len(tested)} tried, none accepted yet)" if tested else "")
    if tested:
        return f"{len(tested)} candidates tested it; none accepted"
    return "open: its probe did not run" if status == "open" else "inconclusive: its probe could not decide"


def ranking(trial: dict) -> float:
    """What trials are ranked by, higher is better: the objective; for a trial run on a cluster node, its
    objective over its own same-node twin baseline's (absolute figures from different nodes, or from one
    node under different neighbours, do not compare)."""
    value = trial.get("objective_ratio", trial["objective"]) if trial.get("node") else trial["objective"]
    return -math.inf if value is None else value


def best_of(trials: list[dict]) -> tuple[dict | None, list[str]]:
    """The best feasible measured trial, and what limited the result."""
    measured = [t for t in trials if t["status"] == "measured"]
    feasible = [t for t in measured if t["feasible"]]
    limits = []
    if not measured:
        limits.append("no proposal reached an end-to-end run (" + "; ".join(sorted({t.get("why", "") for t in trials}))
                      + ")")
    elif not feasible:
        failed = sum(any(j.get("verdict") == "fail" for j in t.get("judgements") or []) for t in measured)
        limits.append(f"no measured proposal passed every criterion ({failed} failed one, "
                      f"{len(measured) - failed} left one inconclusive)")
    best = max(feasible, key=ranking, default=None)
    return best, limits


def probes_until(ledger: Ledger, run_id: int, words: list[str]) -> tuple[int, dict[str, Any]] | None:
    """(probe runs up to and including the one that settled it, the hypothesis) for the first supported
    hypothesis whose claim says every one of words; None when none does."""
    supported = [h for h in ledger.hypotheses(run_id)
                 if h["status"] == "supported" and all(w in h["claim"] for w in words)]
    used = 0
    for row in ledger.probe_results(run_id):
        used += charged(row["feedback"])
        found = next((h for h in supported if h.get("settled_by") == row["key"]), None)
        if found is not None:
            return used, found
    return None
