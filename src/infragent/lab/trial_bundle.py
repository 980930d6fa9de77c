"""What a trial run on another node brings home: every probe record it made (its Feedback, with the bytes of
each artifact it cites), every process group it launched (with its log's bytes), the node's name and the
trial's clock, and its verdict. The node records into a ledger of its own, in a temporary folder; the bundle
is that ledger read back, so nothing depends on the driver and the node sharing a filesystem.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infragent.lab.ledger import Ledger


@dataclass
class ShippedRecord:
    """One probe record as the node made it; artifacts: (sha256, description, bytes) of its evidence."""

    key: str
    feedback: dict[str, Any]
    experiment: str | None  # the experiment's name on the node ("baseline", "trial/N")
    artifacts: list[tuple[str, str, bytes]] = field(default_factory=list)


@dataclass
class ShippedLaunch:
    """One process group the trial launched on its node, stopped before the bundle left."""

    role: str
    pgid: int
    port: int | None
    argv: list[str]
    started: float
    stopped: float | None
    status: str
    note: str | None
    log: bytes


@dataclass
class TrialBundle:
    """A trial's results from the node that ran it."""

    node: str  # "host/node-id prefix": every figure in it was measured there
    started: float  # epoch seconds on the node, as the trial began and ended
    finished: float
    records: list[ShippedRecord]
    launches: list[ShippedLaunch]
    log: list[str]  # the trial's log lines
    judged: dict[str, Any] | None  # the target's verdict on the candidate (None when it could not be judged)
    failure: str | None = None  # why it could not be judged on this node ("the baseline target did not start")
    environment: dict[str, Any] | None = None  # the node's CPU, GPU, packages and checkout


def shipped_records(ledger: Ledger, run_id: int, leave_out: set[str]) -> list[ShippedRecord]:
    """Every probe record of the run except the keys left out (records the driver gave the node)."""
    names = _experiment_names(ledger, run_id)
    records = []
    for row in ledger.probe_results(run_id):
        if row["key"] in leave_out:
            continue
        feedback = row["feedback"]
        artifacts = []
        for item in feedback.get("evidence", []):
            stored = ledger.artifact_path(item["sha256"])
            source = stored if stored.exists() else Path(item["path"])
            if source.exists():
                artifacts.append((item["sha256"], item.get("description", ""), source.read_bytes()))
        records.append(ShippedRecord(row["key"], feedback, names.get(row["key"]), artifacts))
    return records


def shipped_launches(ledger: Ledger, run_id: int) -> list[ShippedLaunch]:
    """Every launch of the run, with its log's bytes."""
    launches = []
    for row in ledger.launches(run_id):
        log = Path(row["log_path"]) if row["log_path"] else None
        launches.append(ShippedLaunch(row["role"], row["pgid"], row["port"], row["argv"], row["started"],
                                      row["stopped"], row["status"], row["note"],
                                      log.read_bytes() if log is not None and log.exists() else b""))
    return launches


def _experiment_names(ledger: Ledger, run_id: int) -> dict[str, str]:
    rows = ledger.db.execute("SELECT p.key, e.name FROM probe_results p JOIN experiments e ON e.id = p.experiment_id "
                             "WHERE p.run_id = ?", (run_id,)).fetchall()
    return {key: name for key, name in rows}
