"""A run's context: the ledger and run id, the budget and what is spent of it, the probe records so far,
and the log. Every step of the loop records through it, so every probe is one ledger record with its cost,
and a resumed run finds what it already has.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from infragent.lab.ledger import Ledger, charged
from infragent.lab.spec import Spec
from infragent.probes.feedback import Feedback


@dataclass
class Budget:
    """When to stop: whichever comes first."""

    probes: int = 12
    minutes: float = 8.0
    trials: int | None = None  # trials started at most (None: no limit of its own)


FEEDBACK_MODES = ("ladder", "e2e-only")  # the cheapest-first ladder, or every proposal judged end to end only


def clip(text: str, limit: int = 600) -> str:
    """text cut at a word boundary near limit, with a mark that it goes on (the ledger keeps it whole)."""
    return text if len(text) <= limit else text[:text.rfind(" ", 0, limit)] + " …"


def fresh_key(done: dict, key: str) -> str:
    """key, or key@2, key@3... when an earlier (interrupted) attempt already recorded it."""
    attempt, fresh = 1, key
    while fresh in done:
        attempt += 1
        fresh = f"{key}@{attempt}"
    return fresh


class RunContext:
    """One optimize run as the loop and the targets see it."""

    def __init__(self, spec: Spec, spec_path: Path, ledger: Ledger, run_id: int, budget: Budget,
                 log: Callable[[str], None], seed: int = 0, feedback: str = "ladder") -> None:
        if feedback not in FEEDBACK_MODES:
            raise ValueError(f"--feedback {feedback}: choose one of {', '.join(FEEDBACK_MODES)}")
        self.spec, self.spec_path, self.ledger, self.run_id = spec, spec_path, ledger, run_id
        self.budget, self.log, self.seed, self.feedback = budget, log, seed, feedback
        self.done: dict[str, dict] = {r["key"]: r for r in ledger.probe_results(run_id)}
        self.probes = sum(1 for r in self.done.values() if charged(r["feedback"]))
        self.start = time.monotonic()
        self.events: list[tuple[float, str]] = []  # (seconds since start, what happened): the discipline's clock

    def minutes(self) -> float:
        """Minutes this process has run the loop."""
        return (time.monotonic() - self.start) / 60

    def left(self, probes_needed: int = 1) -> bool:
        """Whether the budget allows this many more probe runs, and another trial to start (minutes)."""
        return self.probes_left(probes_needed) and self.minutes() < self.budget.minutes

    def probes_left(self, probes_needed: int = 1) -> bool:
        """Whether the probe budget allows this many more probe runs (the diagnosis: minutes bound trials)."""
        return self.probes + probes_needed <= self.budget.probes

    def trials_left(self, started: int) -> bool:
        """Whether the trial budget allows another trial after `started` (finished and in flight)."""
        return self.budget.trials is None or started < self.budget.trials

    def spent(self) -> str:
        """The budget as spent, in words."""
        return (f"budget: {self.probes} probes of {self.budget.probes}, {self.minutes():.1f} of "
                f"{self.budget.minutes:g} minutes" + (f", {self.budget.trials} trials" if self.budget.trials else ""))

    def note(self, event: str) -> None:
        """A moment worth timing (a diagnosis, an acceptance), with the seconds since the loop started."""
        self.events.append((round(time.monotonic() - self.start, 2), event))

    def record(self, key: str, feedback: Feedback | dict, experiment: int | None = None,
               started: float | None = None, charge: bool = True) -> dict:
        """One probe's Feedback as a ledger record, with what it cost (details.cost_s, unless the probe timed
        itself); charge=False for records that are part of a probe already charged (its raw loadgen runs)."""
        key = fresh_key(self.done, key)  # a trial interrupted part-way runs again: earlier records stay
        data = feedback.to_dict() if isinstance(feedback, Feedback) else feedback
        details = data.setdefault("details", {})
        details.setdefault("cost_s", round(time.monotonic() - started, 2) if started is not None else 0.0)
        if not charge:
            details["charged"] = False
        evidence = [(e["path"], e["description"]) for e in data.get("evidence", [])]
        self.ledger.record_probe(self.run_id, key, data, experiment, evidence)
        if charge:
            self.probes += 1
            self.log(f"  [{key}] {data['verdict'].upper()} ({details['cost_s']:.0f} s): {clip(data['finding'])}")
        self.done[key] = {"key": key, "feedback": data, "verdict": data["verdict"]}
        return self.done[key]

    def artifact_home(self, folder: str) -> Path:
        """A folder beside the ledger, as an absolute path (children run in other folders)."""
        return (self.ledger.home / folder).resolve()
