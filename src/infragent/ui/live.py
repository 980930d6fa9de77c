"""What changed in a run since the last look, read from the ledger: new probe records (each gate as it
finishes), new or changed trials, the run's status and the budget left. The dashboard streams these."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from infragent.lab.ledger import Ledger, charged


@dataclass
class Cursor:
    """How far a follower has read: the last probe record id and each trial's last seen status."""

    probe_id: int = 0
    used: int = 0  # probe runs charged to the budget so far
    trials: dict[int, str] = field(default_factory=dict)
    status: tuple[str, str | None] | None = None


def changes(ledger: Ledger, run_id: int, cursor: Cursor) -> list[tuple[str, dict[str, Any]]]:
    """(event, data) for everything new since cursor, which is advanced."""
    events: list[tuple[str, dict[str, Any]]] = []
    rows = ledger.db.execute("SELECT p.id, p.key, p.probe, p.verdict, p.finding, p.created, f.data FROM probe_results p "
                             "JOIN feedback f ON f.probe_result_id = p.id WHERE p.run_id = ? AND p.id > ? ORDER BY p.id",
                             (run_id, cursor.probe_id)).fetchall()
    for pid, key, probe, verdict, finding, created, data in rows:
        feedback = json.loads(data)
        cost = feedback.get("details", {}).get("cost_s")
        cursor.used += charged(feedback)
        events.append(("probe", {"key": key, "probe": probe, "verdict": verdict, "finding": finding[:400],
                                 "cost_s": cost, "at": created}))
        cursor.probe_id = pid
    for c in ledger.candidates(run_id):
        state = f"{c['status']}/{c.get('feasible')}"
        if cursor.trials.get(c["trial"]) != state:
            cursor.trials[c["trial"]] = state
            change = c.get("patch") and f"patch ({c['patch'].count(chr(10))} lines)" or c.get("knobs", {})
            events.append(("trial", {"trial": c["trial"], "status": c["status"], "feasible": bool(c.get("feasible")),
                                     "accepted": c["status"] == "measured" and bool(c.get("feasible")),
                                     "objective": c.get("objective"), "change": change, "why": c.get("why", "")[:400]}))
    status = progress(ledger, run_id, cursor.used)
    if cursor.status != (status["status"], status["note"]) or rows:
        cursor.status = (status["status"], status["note"])
        events.append(("status", status))
    return events


def progress(ledger: Ledger, run_id: int, used: int) -> dict[str, Any]:
    """The run's status and note, and its budget against what it has used: probes charged, minutes since start."""
    run = ledger.run(run_id)
    budget = json.loads(run["budget"]) if run.get("budget") else None
    minutes = (time.time() - run["created"]) / 60 if run["status"] == "running" else (run["updated"] - run["created"]) / 60
    return {"status": run["status"], "note": run.get("note"), "probes_used": used, "minutes": round(minutes, 2),
            "budget": budget,
            "probes_left": None if budget is None else max(budget["probes"] - used, 0),
            "minutes_left": None if budget is None else round(max(budget["minutes"] - minutes, 0.0), 2)}
