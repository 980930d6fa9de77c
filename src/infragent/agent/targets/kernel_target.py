"""A kernel target under the loop: the baseline's diagnosis (check and a trace, then what their findings
call for), and each candidate — knob values, or a patch in a git worktree of the spec's `code` folder —
through the gates in a child process with a timeout and a memory limit: check → bench → criteria.
"""
from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

from infragent.agent.context import RunContext, clip
from infragent.agent.hypotheses import Hypothesis
from infragent.agent.targets.kernel_code import load_kernel_code
from infragent.agent.targets.kernel_gates import GATE_OF, gates_argv
from infragent.agent.targets.kernel_hypotheses import KernelDiagnostics
from infragent.agent.targets.kernel_ladder import kernel_probes
from infragent.agent.proposal import Probe
from infragent.agent.targets import Candidate, proposal_info
from infragent.agent.workspace import Workspace, run_limited
from infragent.lab.spec import Spec
from infragent.probes.artifacts import artifact_dir
from infragent.probes.callables import forget_modules
from infragent.probes.feedback import Feedback

GATES_TIMEOUT_S = 600.0
GATES_MEMORY_GB = 12.0


class KernelTarget:
    """A folder of Python callables: candidate, reference, inputs (and optionally a threaded workload)."""

    def __init__(self, spec: Spec, spec_path: Path) -> None:
        self.spec, self.spec_path = spec, spec_path
        self.baseline_knobs = {n: k.default for n, k in spec.knobs.items() if k.default is not None}
        self.code_dir = (spec_path.parent / (spec.target.code or ".")).resolve()

    def diagnostics(self, ctx: RunContext) -> KernelDiagnostics:
        """check and a trace first; roofline, gil and the bench against the reference when findings call."""
        code = load_kernel_code(self.spec.target, self.spec_path.parent, self.baseline_knobs)
        workload_ref = None
        if self.spec.target.workload:
            file, _, name = self.spec.target.workload.partition(":")
            workload_ref = f"{self.spec_path.parent / file}:{name}"
        return KernelDiagnostics(kernel_probes(code, self.baseline_knobs, workload_ref), self.spec.knobs)

    @contextlib.contextmanager
    def session(self, ctx: RunContext, experiment: int) -> Iterator[None]:
        """Nothing lives across trials: every candidate's gates run in their own child. The diagnosis loads
        the baseline's modules in this process; they are forgotten (and closed) when the trials end."""
        try:
            yield
        finally:
            forget_modules(self.code_dir)
            forget_modules(self.spec_path.parent)

    def workspace(self, ctx: RunContext, number: int) -> Workspace:
        """A worktree of the code folder (a private copy first when it is not in a git repository)."""
        return Workspace.create(self.code_dir, ctx.artifact_home("workspaces"), f"run-{ctx.run_id}-trial-{number}")

    def tools(self, ctx: RunContext, workspace: Workspace, key: str) -> dict[str, Probe]:
        """`gates`: the candidate's gates on the worktree as it stands (charged as one probe run)."""
        root = self._root(workspace)

        def gates(arguments: dict) -> str:
            started = time.monotonic()
            out = ctx.artifact_home("gates") / f"run-{ctx.run_id}-{key.replace('/', '-')}.probe.json"
            result = self._run_gates(root, self.baseline_knobs, out)
            check = result["feedback"]["check"]
            ctx.record(f"{key}/tool/gates", {**check, "probe": "gates", "finding": "the proposer ran the gates: "
                                             + decision(result["judgements"]) if check["verdict"] == "pass"
                                             else f"the proposer ran the gates: check failed: {check['finding']}"},
                       None, started)
            lines = [f"[{name}] {fb['verdict'].upper()}: {fb['finding']}" for name, fb in result["feedback"].items()]
            return "\n".join(lines + [j["message"] for j in result["judgements"]])

        return {"gates": gates}

    def info(self, ctx: RunContext, hypotheses: list[Hypothesis], trials: list[dict]) -> dict[str, Any]:
        """The JSON context for a code proposer."""
        findings = {k: r["feedback"]["finding"] for k, r in ctx.done.items() if k.startswith("ladder/")}
        return proposal_info(ctx, hypotheses, trials, findings)

    def judge(self, ctx: RunContext, candidate: Candidate, hypothesis: Hypothesis | None) -> dict[str, Any]:
        """The gates on the candidate (its worktree, or the spec's folder for knob values)."""
        root = self._root(candidate.workspace) if candidate.workspace is not None else self.spec_path.parent
        baseline = candidate.knobs if candidate.workspace is not None else self.baseline_knobs
        out = ctx.artifact_home("gates") / f"run-{ctx.run_id}-{candidate.number}.json"
        started = time.monotonic()
        gates = self._run_gates(root, baseline, out, candidate.knobs)
        for name, fb in gates["feedback"].items():  # the roofline is the report's evidence, not a decision: uncharged
            ctx.record(f"{candidate.key}/{name}", fb, candidate.experiment, started, charge=name != "roofline")
            started = time.monotonic()
        check = gates["feedback"]["check"]
        if check["verdict"] != "pass":
            return {"why": f"failed the check: {clip(check['finding'], 320)}"}
        bench = gates["feedback"].get("bench")
        local = {"key": f"{candidate.key}/bench", "verdict": bench["verdict"], "finding": bench["finding"]} if bench else None
        return {"status": "measured", "objective": gates["objective"], "feasible": gates["feasible"],
                "judgements": gates["judgements"], "finding": trial_finding(gates), "local": local,
                "why": decision(gates["judgements"])}

    def _root(self, workspace: Workspace) -> Path:
        return workspace.root / self.spec_path.parent.relative_to(self.code_dir)

    def _run_gates(self, root: Path, baseline_knobs: dict, out: Path, knobs: dict | None = None) -> dict:
        """The gates in a child process (its working folder: root); its result, or a failed check naming why
        the child died. Every path the child gets is absolute."""
        root, out = root.resolve(), out.resolve()
        out.parent.mkdir(parents=True, exist_ok=True)
        argv = gates_argv(self.spec_path, root, self.spec_path.parent, knobs if knobs is not None else baseline_knobs,
                          baseline_knobs, out)
        done = run_limited(argv, cwd=root, timeout_s=GATES_TIMEOUT_S, memory_gb=GATES_MEMORY_GB,
                           env={"INFRAGENT_ARTIFACTS": str(artifact_dir())})  # absolute; evidence stays out of the patch
        if done.rc == 0 and out.exists():
            return json.loads(out.read_text())
        why = (f"timed out after {GATES_TIMEOUT_S:g} s" if done.timed_out else
               f"exited {done.rc}: {(done.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
        failed = Feedback("check", "fail", f"the candidate's gates did not finish: {why}",
                          details={"stderr_tail": done.stderr[-3000:]})
        return {"feedback": {"check": failed.to_dict()}, "judgements": [], "objective": None, "feasible": False}


def trial_finding(gates: dict) -> str:
    """A measured trial in one line: which criteria decided it (each with its gate), then what each bench gate
    measured, in its own direction, and whether that was within the bound of the criterion reading it."""
    judgements = gates["judgements"]
    failed = [j for j in judgements if j["verdict"] != "pass"]
    named = ", ".join(f"[{GATE_OF.get(j['metric'], 'gates')}] {j['metric']} {j['verdict']}"
                      for j in failed or judgements)
    parts = [f"not accepted ({named})" if failed else f"every criterion passes ({named})" if judgements else
             "no criterion to judge: measured only"]
    for name, fb in gates["feedback"].items():
        if fb.get("probe") != "bench":
            continue
        direction = fb.get("details", {}).get("direction", fb["finding"])
        decided = [j for j in judgements if j["metric"] in fb.get("details", {}).get("decided_by", [])]
        if decided:
            verdicts = {j["verdict"] for j in decided}
            where = ("outside" if "fail" in verdicts else "not clearly within" if "inconclusive" in verdicts
                     else "within")
            parts.append(f"[{name}] {direction}, {where} its {' and '.join(j['metric'] for j in decided)} bound")
        else:
            parts.append(f"[{name}] {direction} (informational: no criterion reads it)")
    return "; ".join(parts)


def decision(judgements: list[dict]) -> str:
    """What decided a measured trial, each criterion named with the gate whose numbers it read: the ones that
    did not pass when any did not (they decided), else every criterion."""
    def said(j: dict) -> str:
        return f"[{GATE_OF.get(j['metric'], 'gates')}] {j['message']}"

    failed = [j for j in judgements if j["verdict"] != "pass"]
    if failed:
        return "; ".join(said(j) for j in failed)
    return "every criterion passes: " + "; ".join(said(j) for j in judgements) if judgements else \
        "no criterion to judge: measured only"
