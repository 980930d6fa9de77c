"""Trials on a Ray cluster: the driver proposes (the search asks while earlier trials still run) and keeps as
many trials in flight as the cluster's live nodes can place (the spec's [target] resources per trial); each
trial is a fresh actor holding those resources on one node, where it launches its own twin baseline beside
the candidate (agent/executors/remote_trial.py). Its bundle comes home through Ray's object store and is written to the
run's ledger: records tagged with the node, artifacts by hash, launches and their logs, then the trial's
result (with the node and its clock). A node's A/A floor is measured once there and given to its later
trials; a floor is never used on another node.

A node or worker lost mid-trial, or a node whose baseline will not start, is recorded as a failed attempt
with its cause and retried once on another node; the guardian on the node stops the trial's targets. A
killed driver resumes from the ledger: finished trials are replayed, never run again.
"""
from __future__ import annotations

import contextlib
import hashlib
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from infragent.agent.context import Budget, RunContext
from infragent.agent.hypotheses import Hypothesis
from infragent.agent.proposal import Proposer, SearchDone
from infragent.agent.executors.remote_trial import TrialJob, TrialRunner, spec_files
from infragent.agent.targets import Candidate, LoopTarget
from infragent.agent.trial import MAX_FAILED_PROPOSALS, conclude, fresh_result, propose, settle, store
from infragent.agent.workspace import WorkspaceError
from infragent.lab.ledger import charged
from infragent.lab.trial_bundle import TrialBundle
from infragent.probes.feedback import Feedback

ATTEMPTS = 2  # a trial whose node is lost (or whose baseline will not start there) runs once more elsewhere
WAIT_S = 2.0  # how often the driver looks at the cluster while trials run


@dataclass
class Flight:
    """One trial attempt in flight on the cluster."""

    candidate: Candidate
    hypothesis: Hypothesis | None
    result: dict[str, Any]
    job: TrialJob
    attempt: int
    actor: Any
    run_ref: Any
    where_ref: Any
    workspace: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)  # the proposer's worktree
    node: str | None = None
    node_id: str | None = None
    failed_on: list[str] = field(default_factory=list)  # node ids of earlier attempts


def run_trials(ctx: RunContext, target: LoopTarget, proposer: Proposer, hypotheses: list[Hypothesis],
               replays: dict[int, dict], address: str | None) -> tuple[list[dict], list[str]]:
    """Every trial of the run (replayed ones first, then in the order they finished) and what limited it."""
    ray = _import_ray()
    started_here = not ray.is_initialized()
    if started_here:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:  # a one-node cluster on this machine, for the run
            ray.init(include_dashboard=False, log_to_driver=False)
    demand = ctx.spec.target.resources.ray_demand()
    ctx.log(f"executor ray: {len(_alive(ray))} nodes, each trial holds {demand}")
    runner = ray.remote(TrialRunner)
    trials: list[dict] = []
    for number in sorted(replays):  # a resumed run: finished trials are told, never run again
        conclude(ctx, proposer, hypotheses, trials, replays[number], 0)
    spec_hash = hashlib.sha256(ctx.spec_path.read_bytes()).hexdigest()
    shipped = spec_files(ctx.spec_path)
    calibrations = _calibrations(ctx)
    numbers = (n for n in itertools.count() if n not in replays)
    flights: dict[Any, Flight] = {}
    limits: list[str] = []
    stopping: str | None = None
    failures = 0
    try:
        while True:
            while stopping is None and len(flights) < _capacity(ray, demand):
                if not ctx.left(probes_needed=2 * (len(flights) + 1)) or not ctx.trials_left(len(trials) + len(flights)):
                    if not flights:  # else the running trials may leave budget (their records not counted yet)
                        stopping = ctx.spent()
                    break
                number = next(numbers)
                result = fresh_result(number, target, proposer)
                stack = contextlib.ExitStack()
                try:
                    ws = stack.enter_context(target.workspace(ctx, number)) if proposer.edits_code else None
                    running = [f.result for f in flights.values()]
                    proposed = propose(ctx, target, proposer, result, hypotheses, trials + running, ws,
                                       time.monotonic())
                except SearchDone as done:
                    stack.close()
                    stopping = str(done)
                    break
                except WorkspaceError as err:
                    proposed = store(ctx, result, f"workspace: {str(err)[:300]}")
                if isinstance(proposed, dict):  # nothing to judge: stored already
                    stack.close()
                    failures = conclude(ctx, proposer, hypotheses, trials, proposed, failures)
                    if failures >= MAX_FAILED_PROPOSALS:
                        stopping = f"the {proposer.name} proposer gave no new change {failures} times in a row"
                    continue
                candidate, hypothesis = proposed
                ws = candidate.workspace
                job = TrialJob(number, candidate.knobs, candidate.proposal, hypothesis, str(ctx.spec_path),
                               spec_hash, shipped, _budget_left(ctx), ctx.seed, ctx.feedback, calibrations,
                               ws.code_tree() if ws and candidate.proposal.patch else "",
                               ws.code_prefix() if ws else ".")
                flight = _launch(ray, runner, demand, candidate, hypothesis, result, job, 1, [], stack)
                flights[flight.run_ref] = flight
            if not flights and stopping is None and _capacity(ray, demand) == 0:
                stopping = (f"no live node of the cluster can hold a trial: each needs {demand}; the nodes offer "
                            f"{[n.get('Resources') for n in _alive(ray)]} (fix [target] resources or add nodes)")
            if not flights:
                break
            done, _ = ray.wait(list(flights), num_returns=1, timeout=WAIT_S)
            _locate(ray, flights.values())
            for ref in done:
                flight = flights.pop(ref)
                finished = _land(ray, ctx, flight, calibrations, retry=_capacity(ray, demand) > 0)
                if finished is None:  # a failed attempt, to run again elsewhere
                    retry = _launch(ray, runner, demand, flight.candidate, flight.hypothesis, flight.result,
                                    flight.job, flight.attempt + 1, flight.failed_on + [flight.node_id or ""],
                                    flight.workspace)
                    flights[retry.run_ref] = retry
                    continue
                finished = settle(ctx, hypotheses, flight.result, finished, flight.candidate, proposer)
                flight.workspace.close()
                failures = conclude(ctx, proposer, hypotheses, trials, finished, failures)
                if failures >= MAX_FAILED_PROPOSALS and stopping is None:
                    stopping = f"the {proposer.name} proposer gave no new change {failures} times in a row"
    finally:
        for flight in flights.values():  # interrupted: its targets die with the actor (the node's guardian)
            with contextlib.suppress(Exception):
                ray.kill(flight.actor)
            flight.workspace.close()
        if started_here:
            ray.shutdown()
    if stopping:
        limits.append(stopping)
    return trials, limits


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RuntimeError("--executor ray needs Ray: pip install 'infragent[ray]' (or run without --executor "
                           "ray: trials then run here, one after another)") from None
    return ray


def _alive(ray: Any) -> list[dict]:
    return [n for n in ray.nodes() if n.get("Alive")]


def _fits(node: dict, demand: dict[str, float]) -> int:
    """How many trials the node's resources hold at once."""
    held = node.get("Resources", {})
    return min((int(held.get(name, 0.0) // amount) for name, amount in demand.items()), default=1)


def _capacity(ray: Any, demand: dict[str, float]) -> int:
    """Trials the live nodes can hold at once."""
    return sum(_fits(node, demand) for node in _alive(ray))


def _launch(ray: Any, runner: Any, demand: dict[str, float], candidate: Candidate, hypothesis: Hypothesis | None,
            result: dict, job: TrialJob, attempt: int, failed_on: list[str],
            workspace: contextlib.ExitStack) -> Flight:
    """A fresh actor for the attempt, on any node that fits (a retry: on a node other than where it failed)."""
    options: dict[str, Any] = {"num_cpus": demand.get("CPU", 0.0), "num_gpus": demand.get("GPU", 0.0),
                               "resources": {k: v for k, v in demand.items() if k not in ("CPU", "GPU")},
                               "max_restarts": 0, "max_task_retries": 0}
    if failed_on:
        other = next((n["NodeID"] for n in _alive(ray) if n["NodeID"] not in failed_on and _fits(n, demand) > 0), None)
        if other is not None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(other, soft=False)
    actor = runner.options(**options).remote()
    where = actor.where.remote()  # first: an actor runs its calls in order, and the node is wanted while run runs
    return Flight(candidate, hypothesis, result, job, attempt, actor, actor.run.remote(job), where, workspace,
                  failed_on=failed_on)


def _land(ray: Any, ctx: RunContext, flight: Flight, calibrations: dict[str, dict], retry: bool) -> dict | None:
    """A finished attempt into the ledger: the target's verdict, or None when it failed and may run again (a
    failed last attempt, or one no live node could run again, becomes the trial's verdict)."""
    _locate(ray, [flight])
    bundle: TrialBundle | None = None
    try:
        bundle = ray.get(flight.run_ref)
        flight.node = bundle.node
        cause = None if bundle.failure is None else f"target did not start on {bundle.node}: {bundle.failure}"
    except ray.exceptions.RayTaskError as err:
        cause = f"the trial failed on {flight.node or 'its node'}: {str(err.cause if hasattr(err, 'cause') else err)[:400]}"
    except ray.exceptions.RayError as err:
        if flight.node is None:
            _placed(ray, flight)
        cause = f"node lost: {flight.node or 'the node'} went away mid-trial ({type(err).__name__})"
    finally:
        with contextlib.suppress(Exception):
            ray.kill(flight.actor)
    if bundle is not None:
        _adopt(ctx, flight, bundle, calibrations)
    if cause is None:
        assert bundle is not None and bundle.judged is not None
        flight.result.update(node=bundle.node, started_at=bundle.started, finished_at=bundle.finished,
                             attempts=flight.attempt)
        if bundle.environment is not None:
            flight.result["node_environment"] = ctx.ledger.environment(bundle.environment)
        return dict(bundle.judged)
    again = flight.attempt < ATTEMPTS and retry
    ctx.record(f"{flight.job.key}/attempt-{flight.attempt}", Feedback(
        "trial", "fail", f"{cause}; " + ("retried once on another node" if again else "not retried again" if retry
                                         else "no live node can hold it to retry"),
        details={"node": flight.node, "attempt": flight.attempt, "cause": cause}), flight.candidate.experiment,
        charge=False)
    ctx.log(f"  [{flight.job.key}] attempt {flight.attempt} FAILED: {cause[:300]}")
    if again:
        return None
    flight.result.update(node=flight.node, attempts=flight.attempt)
    return {"status": "node lost" if cause.startswith("node lost") else "not started", "why": cause}


def _locate(ray: Any, flights: Any) -> None:
    """Learn where each placed attempt runs, as soon as its actor answers (a lost node is then named)."""
    for flight in flights:
        if flight.node is None:
            ready, _ = ray.wait([flight.where_ref], timeout=0)
            if ready:
                try:
                    flight.node, flight.node_id = ray.get(ready[0])
                except ray.exceptions.RayError:
                    pass  # its actor died before it answered: the node stays unnamed


def _placed(ray: Any, flight: Flight) -> None:
    """Name the node the scheduler placed an attempt's actor on, from the cluster's actor table: an actor placed
    on a node that died before the node was declared dead never answers `where`."""
    try:
        from ray._private import state

        node_id = state.actors(actor_id=flight.actor._actor_id.hex()).get("Address", {}).get("NodeID", "")
        hosts = {n["NodeID"]: n.get("NodeManagerHostname", "") for n in ray.nodes()}
    except Exception:  # noqa: BLE001 (a private table: when it moves, the node stays unnamed)
        return
    if node_id in hosts:
        flight.node, flight.node_id = f"{hosts[node_id]}/{node_id[:8]}", node_id


def _adopt(ctx: RunContext, flight: Flight, bundle: TrialBundle, calibrations: dict[str, dict]) -> None:
    """The bundle's launches, logs and records into the run's ledger, each naming the node."""
    key, node = flight.job.key, bundle.node
    for launch in bundle.launches:
        role = launch.role if launch.role.startswith(key) else f"{key}/{launch.role}"
        log = ctx.artifact_home("logs") / f"run-{ctx.run_id}-{role.replace('/', '-')}-{node.replace('/', '-')}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_bytes(launch.log)
        launch_id = ctx.ledger.record_launch(ctx.run_id, role, launch.pgid, launch.port, launch.argv, str(log),
                                             launch.started, node=node)
        ctx.ledger.set_launch(launch_id, stopped=launch.stopped or bundle.finished, status=launch.status,
                              note=launch.note)
    ctx.log(f"  [{key}] ran on {node} (attempt {flight.attempt})")
    recorded = tuple(f"  [{record.key}]" for record in bundle.records)
    for line in bundle.log:  # what the node said besides its records (logged below as they land)
        if not line.startswith(recorded):
            ctx.log(f"  [{node}] {line.strip()}")
    for record in bundle.records:
        feedback = record.feedback
        for item, (_, _, data) in zip(feedback.get("evidence", []), record.artifacts):
            item["path"] = str(ctx.ledger.put_artifact(data))
        feedback["evidence"] = feedback.get("evidence", [])[:len(record.artifacts)]
        feedback.setdefault("details", {})["node"] = node
        own = record.key.startswith(key)
        experiment = flight.candidate.experiment if record.experiment == key else _experiment(ctx, record.experiment)
        ctx.record(record.key if own else f"{record.key}@{node}", feedback, experiment,
                   charge=charged(feedback))
        if not own:  # measured on this node for any trial there (its A/A floor): later trials there reuse it
            calibrations.setdefault(node, {})[record.key] = feedback


def _experiment(ctx: RunContext, name: str | None) -> int | None:
    """The run's experiment by that name ("baseline"), if it has one."""
    knobs = ctx.ledger.experiment_knobs(ctx.run_id, name) if name else None
    return None if knobs is None else ctx.ledger.experiment(ctx.run_id, name, knobs)


def _calibrations(ctx: RunContext) -> dict[str, dict[str, dict]]:
    """The per-node records a resumed run already has (key@node), by node and key."""
    found: dict[str, dict[str, dict]] = {}
    for key, record in ctx.done.items():
        base, _, node = key.partition("@")
        if node and base.startswith("calibration/"):
            found.setdefault(node.split("@")[0], {})[base] = record["feedback"]
    return found


def _budget_left(ctx: RunContext) -> Budget:
    """What the run has left, for a trial's own end-to-end repeats."""
    return Budget(probes=max(ctx.budget.probes - ctx.probes, 2), minutes=max(ctx.budget.minutes - ctx.minutes(), 0.5))
