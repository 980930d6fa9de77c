"""One trial on a Ray node, with its twin: the node launches its own baseline beside the candidate and judges
the candidate against it through the target's ladder, so every relative figure pairs samples measured on
that node. The node records into a ledger of its own in a temporary folder (its artifacts and target logs
too) and sends it all home as a TrialBundle; a guardian process stops the trial's targets if the node's
worker dies first. Nothing here imports Ray: the executor wraps TrialRunner as an actor.
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infragent.agent.context import Budget, RunContext
from infragent.agent.hypotheses import Hypothesis
from infragent.agent.proposal import Proposal
from infragent.agent.targets.serving_target import RunError
from infragent.agent.target_kinds import make_target
from infragent.agent.targets import Candidate
from infragent.agent.workspace import WorkspaceError
from infragent.lab import environment
from infragent.lab.guardian import Guardian
from infragent.lab.ledger import Ledger
from infragent.lab.spec import load_spec
from infragent.lab.trial_bundle import TrialBundle, shipped_launches, shipped_records
from infragent.probes.artifacts import ENV as ARTIFACTS_ENV

SPEC_FOLDER_LIMIT = 16 << 20  # bytes of the spec's folder shipped to nodes that lack it


@dataclass
class TrialJob:
    """What a node needs to judge one candidate."""

    number: int
    knobs: dict[str, Any]
    proposal: Proposal  # its patch (applied in a worktree on the node), rationale, hypothesis
    hypothesis: Hypothesis | None
    spec_path: str  # as the driver sees it; used when the node has the same file
    spec_hash: str
    spec_files: dict[str, bytes]  # the spec's folder, relative paths: for a node without it
    budget: Budget  # what is left of the run's
    seed: int
    feedback: str
    calibrations: dict[str, dict[str, dict]] = field(default_factory=dict)  # node → key → its A/A records
    code_tree: str = ""  # a patch's starting code, as the git id of the driver's code folder ("": no patch)
    code_prefix: str = "."  # that folder's path in the driver's worktree, where the patch's paths start

    @property
    def key(self) -> str:
        return f"trial/{self.number}"


def spec_files(spec_path: Path) -> dict[str, bytes]:
    """The spec's folder (kernel files, prompt files beside it), or the spec alone when the folder is big."""
    folder = spec_path.parent
    files: dict[str, bytes] = {}
    total = 0
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if not path.is_file() or any(p.startswith(".") or p == "__pycache__" for p in relative.parts):
            continue
        total += path.stat().st_size
        if total > SPEC_FOLDER_LIMIT:
            return {spec_path.name: spec_path.read_bytes()}
        files[str(relative)] = path.read_bytes()
    return files


def node_label() -> str:
    """This node's name in the ledger: host and the Ray node id's first 8 characters."""
    try:
        import ray

        node_id = ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 (outside Ray: this machine)
        node_id = "local"
    return f"{socket.gethostname()}/{node_id[:8]}"


class NodeLedger(Ledger):
    """The trial's own ledger on the node; every launch is guarded until it is recorded as stopped."""

    def __init__(self, path: Path, guardian: Guardian) -> None:
        super().__init__(path)
        self.guardian = guardian
        self.groups: dict[int, int] = {}  # launch id → process group

    def record_launch(self, run_id: int, role: str, pgid: int, port: int | None, argv: list[str],
                      log_path: str | None, started: float, node: str | None = None) -> int:
        """Record the launch and guard its group."""
        self.guardian.guard(pgid, started)
        launch = super().record_launch(run_id, role, pgid, port, argv, log_path, started, node)
        self.groups[launch] = pgid
        return launch

    def set_launch(self, launch_id: int, **fields: Any) -> None:
        """Update the launch; one stopped by its owner needs no guard."""
        super().set_launch(launch_id, **fields)
        if "stopped" in fields and launch_id in self.groups:
            self.guardian.release(self.groups.pop(launch_id))


class TrialRunner:
    """The actor body: where it runs, then one trial (a fresh actor per attempt)."""

    def where(self) -> tuple[str, str]:
        """(this node's label, its Ray node id)."""
        import ray

        return node_label(), ray.get_runtime_context().get_node_id()

    def run(self, job: TrialJob) -> TrialBundle:
        """Judge the job's candidate on this node."""
        return run_trial(job)


def run_trial(job: TrialJob) -> TrialBundle:
    """The candidate and its twin baseline through the target's ladder on this node, recorded in a ledger of
    the node's own and shipped back whole."""
    node, began, lines = node_label(), time.time(), []
    with tempfile.TemporaryDirectory(prefix=f"infragent-trial-{job.number}-") as tmp:
        home = Path(tmp)
        os.environ[ARTIFACTS_ENV] = str(home / "raw")
        spec_path = _spec_here(job, home)
        guardian = Guardian()
        ledger = NodeLedger(home / "ledger.sqlite", guardian)
        try:
            run_id = ledger.start_run("trial", str(spec_path), job.spec_hash,
                                      ledger.environment(environment.capture()))
            given = set()
            for key, data in job.calibrations.get(node, {}).items():  # this node's A/A floor, measured by a trial before
                ledger.record_probe(run_id, key, data)
                given.add(key)
            spec = load_spec(spec_path)
            ctx = RunContext(spec, spec_path, ledger, run_id, job.budget, lines.append, job.seed, job.feedback)
            judged, failure = _judge(ctx, job, ledger, run_id)
            return TrialBundle(node, began, time.time(), shipped_records(ledger, run_id, given),
                               shipped_launches(ledger, run_id), lines, judged, failure,
                               ledger.environment_data(ledger.run(run_id)["environment_id"]))
        finally:
            ledger.close()
            guardian.close()


def _judge(ctx: RunContext, job: TrialJob, ledger: Ledger, run_id: int) -> tuple[dict | None, str | None]:
    """(the target's verdict, None), or (None, why it could not be judged on this node)."""
    target = make_target(ctx.spec, ctx.spec_path)
    try:
        with target.session(ctx, ledger.experiment(run_id, "baseline", target.baseline_knobs)):
            with (target.workspace(ctx, job.number) if job.proposal.patch else contextlib.nullcontext()) as ws:
                if ws is not None:
                    tree = ws.code_tree()
                    if tree != job.code_tree:  # the patch would change other code than it was made on
                        return None, (f"the code on node {node_label()} differs from the driver's (tree "
                                      f"{tree[:12]}, the driver's {job.code_tree[:12]}): give every node "
                                      f"the checkout the driver has")
                    ws.apply(job.proposal.patch, job.code_prefix)
                candidate = Candidate(job.number, job.key, job.knobs, ws, job.proposal,
                                      ledger.experiment(run_id, job.key, job.knobs))
                return target.judge(ctx, candidate, job.hypothesis), None
    except RunError as err:  # the node's own baseline failed: another node may do better
        return None, str(err)[:600]
    except WorkspaceError as err:
        return {"why": f"workspace: {str(err)[:300]}"}, None


def _spec_here(job: TrialJob, home: Path) -> Path:
    """The spec file on this node: the driver's path when it holds the same bytes, else the shipped folder."""
    path = Path(job.spec_path)
    if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == job.spec_hash:
        return path
    folder = home / "spec"
    for relative, data in job.spec_files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_bytes(data)
    shipped = folder / path.name
    if not shipped.is_file():
        raise FileNotFoundError(f"{job.spec_path}: not on node {node_label()} and not shipped with the trial")
    return shipped
