"""The one interface the loop has to what it optimizes: a target prepares a candidate (a worktree with a
patch, and knob values), launches it or loads its callables, probes it cheapest first, and stops it.
Implementations: the engine and command targets (agent/targets/serving_target.py) and kernel targets
(agent/targets/kernel_target.py); agent/core.py picks one for the spec."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Protocol

from infragent.agent.proposal import Probe, Proposal

if TYPE_CHECKING:
    from infragent.agent.context import RunContext
    from infragent.agent.diagnosis import Diagnostics
    from infragent.agent.hypotheses import Hypothesis
    from infragent.agent.workspace import Workspace


@dataclass
class Candidate:
    """One proposal made concrete: its knob values and, for a patch, the worktree holding it."""

    number: int
    key: str  # trial/N: the prefix of its ledger records
    knobs: dict[str, Any]
    workspace: "Workspace | None"
    proposal: Proposal
    experiment: int
    local: dict[str, Any] | None = None  # the local probe that already judged it (key, verdict, finding)
    spans: list[str] = field(default_factory=list)  # where a win came from, when a probe localized it


class LoopTarget(Protocol):
    """What the loop needs from a target."""

    baseline_knobs: dict[str, Any]

    def diagnostics(self, ctx: "RunContext") -> "Diagnostics | None":
        """The baseline's probes and how their findings pose hypotheses (None: nothing to diagnose)."""

    def session(self, ctx: "RunContext", experiment: int) -> ContextManager[None]:
        """Whatever lives as long as the trials (a launched baseline and its A/A floor)."""

    def workspace(self, ctx: "RunContext", number: int) -> "Workspace":
        """A fresh worktree of the target's code for candidate number."""

    def tools(self, ctx: "RunContext", workspace: "Workspace", key: str) -> dict[str, Probe]:
        """The probes a code proposer may run on its worktree (each charged to the budget)."""

    def info(self, ctx: "RunContext", hypotheses: list["Hypothesis"], trials: list[dict]) -> dict[str, Any]:
        """What a code proposer is told (JSON): the target, criteria, findings, hypotheses, earlier trials."""

    def judge(self, ctx: "RunContext", candidate: Candidate, hypothesis: "Hypothesis | None") -> dict[str, Any]:
        """The candidate through the target's probes, cheapest first: status, objective, feasible, why, and
        `local` (the local probe's key, verdict and finding) when one ran."""


def proposal_info(ctx: "RunContext", hypotheses: list["Hypothesis"], trials: list[dict],
                  findings: dict[str, str]) -> dict[str, Any]:
    """The JSON context every code proposer gets: spec, target, knobs, criteria, the diagnosis's findings,
    hypotheses (supported first, refuted ones marked closed) and earlier trials."""
    from dataclasses import asdict

    spec = ctx.spec
    order = {"supported": 0, "open": 1, "inconclusive": 2, "refuted": 3}
    return {"spec": str(ctx.spec_path), "target": spec.target.model_dump(exclude_none=True),
            "knobs": {n: k.model_dump() for n, k in spec.knobs.items()},
            "criteria": [c.model_dump(exclude_none=True) for c in spec.criteria],
            "ladder": findings,
            "hypotheses": [asdict(h) for h in sorted(hypotheses, key=lambda h: order.get(h.status, 9))],
            "closed_directions": [h.claim for h in hypotheses if h.status == "refuted"],
            "previous_trials": [trial_summary(t) for t in trials]}


PATCH_LINES = 40  # of an earlier trial's diff in the next proposal's context


def trial_summary(trial: dict) -> dict[str, Any]:
    """An earlier trial as the next proposal needs it: what it changed (its knobs, its patch's first lines and
    size), why (the proposer's rationale), the hypothesis it named, and the gate that decided with its numbers."""
    row = {k: trial.get(k) for k in ("trial", "status", "why", "objective", "feasible", "hypothesis", "knobs",
                                     "rationale")}
    patch = trial.get("patch") or ""
    if patch:
        lines = patch.splitlines()
        files = [line[6:] for line in lines if line.startswith("+++ b/")]
        row["patch"] = "\n".join(lines[:PATCH_LINES]) + (f"\n[... {len(lines) - PATCH_LINES} more lines]"
                                                          if len(lines) > PATCH_LINES else "")
        row["patch_summary"] = (f"{sum(1 for x in lines if x.startswith('+') and not x.startswith('+++'))} lines "
                                f"added, {sum(1 for x in lines if x.startswith('-') and not x.startswith('---'))} "
                                f"removed in {', '.join(files) or 'no named file'}")
    local = trial.get("local")
    if local:
        row["decided_by"] = {"probe": str(local.get("key", "")).rsplit("/", 1)[-1], "verdict": local.get("verdict"),
                             "finding": local.get("finding")}
    return {k: v for k, v in row.items() if v is not None}
