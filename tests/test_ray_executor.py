"""The Ray executor on a real cluster on this machine (ray.cluster_utils.Cluster: a head that holds no trials
and two worker nodes with a custom resource, one cluster for the module): trials run two at a time, each
judged against a twin baseline launched on its own node; a killed driver resumes without running a finished
trial twice; a node removed mid-trial leaves no lost record and no orphan, and its trial runs again on the
other node."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlparse

import psutil
import pytest

from infragent.agent.context import Budget
from infragent.agent.core import optimize
from infragent.agent.executors.remote_trial import TrialJob, _spec_here, spec_files
from infragent.agent.proposal import Proposal
from infragent.agent.workspace import Workspace, WorkspaceError
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Executor, SpecError, load_spec
from infragent.report.run_page import write_report
from server_fixture import CONCURRENT, SRC
from test_command_target import FLAKY, SEQS as COMMAND_SEQS, command_spec

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'infragent[ray]' (make setup does)")

SEQS = COMMAND_SEQS.replace("domain = [1, 8]", "domain = [1, 5]")  # 4 untried points: 4 trials
RESOURCES = 'resources = { num_cpus = 1, custom = { infer_node = 1 } }\nhang_timeout_s'


def ray_spec(folder: Path) -> Path:
    """A command-target spec whose trials each hold one worker node (4 untried points: 4 trials)."""
    spec = folder / "spec.toml"
    spec.write_text(command_spec(SEQS, CONCURRENT).replace("hang_timeout_s", RESOURCES, 1))
    return spec


@pytest.fixture(scope="module")
def cluster():  # noqa: ANN201
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    nodes = [cluster.add_node(num_cpus=1, resources={"infer_node": 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False)
    yield cluster, nodes
    ray.shutdown()
    cluster.shutdown()


def _targets_left() -> list[int]:
    """Target servers of these tests still running anywhere on the machine."""
    left = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if str(FLAKY) in " ".join(proc.info["cmdline"] or []):
            left.append(proc.info["pid"])
    return left


def _no_targets_left(within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while _targets_left() and time.monotonic() < deadline:
        time.sleep(0.5)
    return not _targets_left()


def test_trials_run_two_at_a_time_each_against_a_twin_on_its_own_node(cluster, tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger.sqlite")
    outcome = optimize(ray_spec(tmp_path), ledger, Budget(probes=40, minutes=10), executor=Executor(kind="ray"))
    trials = ledger.candidates(outcome.run_id)
    assert sorted(t["trial"] for t in trials) == [0, 1, 2, 3]
    assert len({t["node"] for t in trials}) == 2
    spans = sorted((t["started_at"], t["finished_at"]) for t in trials)
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:])), spans  # the ledger's clock shows the overlap
    assert outcome.best is not None and any(j["verdict"] == "pass" for j in outcome.best["judgements"])
    feasible = [t for t in trials if t["status"] == "measured" and t["feasible"]]
    assert outcome.best["objective_ratio"] == max(t["objective_ratio"] for t in feasible)  # ranked on its own node
    assert ledger.run(outcome.run_id)["status"] == "completed"
    # twins: every sample a relative judgement rests on came from launches of that trial, on its node
    launches = ledger.launches(outcome.run_id)
    records = ledger.probe_results(outcome.run_id)
    for trial in trials:
        key = f"trial/{trial['trial']}"
        own = [launch for launch in launches if launch["role"].startswith(key)]
        assert {launch["node"] for launch in own} == {trial["node"]}
        assert any(launch["role"] == f"{key}/baseline" for launch in own)
        ports = {launch["port"] for launch in own}
        for record in records:
            if record["key"].startswith(key + "/"):
                feedback = record["feedback"]
                assert feedback["details"]["node"] == trial["node"]
                url = feedback.get("locality", {}).get("base_url")
                if url:  # a loadgen side of a local A/B or an end-to-end run
                    assert urlparse(url).port in ports, (record["key"], url, ports)
    floors = [r for r in records if r["key"].startswith("calibration/aa@")]
    assert {r["feedback"]["details"]["node"] for r in floors} == {t["node"] for t in trials}  # one A/A per node
    assert all(launch["stopped"] is not None for launch in launches) and _no_targets_left()
    page = write_report(ledger, outcome.run_id, tmp_path / "report.html").read_text()
    assert "measured on node" in page and trials[0]["node"] in page


def _optimize_argv(spec: Path, ledger: Path, address: str, *more: str) -> list[str]:
    return [sys.executable, "-m", "infragent.cli", "optimize", str(spec), "--executor", "ray", "--ray-address",
            address, "--ledger", str(ledger), "--budget-probes", "40", "--budget-minutes", "10", *more]


def test_a_killed_driver_resumes_and_runs_no_finished_trial_twice(cluster, tmp_path: Path) -> None:
    spec, path = ray_spec(tmp_path), tmp_path / "ledger.sqlite"
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    output = tmp_path / "driver.log"
    with output.open("w") as log:
        driver = subprocess.Popen(_optimize_argv(spec, path, cluster[0].address), env=env, cwd=tmp_path,
                                  stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600  # a busy machine: the first trial can take minutes; this is not a timing
    before: list[dict] = []
    while time.monotonic() < deadline and not before and driver.poll() is None:
        time.sleep(1.0)
        if path.exists():
            before = Ledger(path).candidates(1)
    exited = driver.poll()
    if not before and path.exists():  # it may have finished a trial (or all) just before it exited
        before = Ledger(path).candidates(1)
    if exited is None:
        os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    state = "was still running" if exited is None else f"exited {exited}"
    assert before, f"no trial finished before the kill (the driver {state}):\n" + output.read_text()[-3000:]
    assert _no_targets_left(60), "the trials in flight left their targets running"
    done = subprocess.run(_optimize_argv(spec, path, cluster[0].address, "--resume", "1"), env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ledger = Ledger(path)
    after = ledger.candidates(1)
    numbers = [t["trial"] for t in after]
    assert len(numbers) == len(set(numbers))
    for kept in before:  # every trial finished before the kill is kept as it was, and not run again
        assert next(t for t in after if t["trial"] == kept["trial"]) == kept
        assert sum(t["knobs"] == kept["knobs"] for t in after) == 1
    assert ledger.run(1)["status"] == "completed"
    assert _no_targets_left()


def test_a_node_lost_mid_trial_is_recorded_and_its_trial_runs_again_elsewhere(cluster, tmp_path: Path) -> None:
    head, nodes = cluster
    lost = nodes[1]
    path, spec, result = tmp_path / "ledger.sqlite", ray_spec(tmp_path), {}
    runner = threading.Thread(target=lambda: result.update(outcome=optimize(  # a SQLite ledger per thread
        spec, Ledger(path), Budget(probes=40, minutes=10), executor=Executor(kind="ray"))))
    runner.start()
    deadline = time.monotonic() + 120
    while ray.available_resources().get("infer_node", 0) > 0 and time.monotonic() < deadline:
        time.sleep(0.2)  # until both worker nodes hold a trial
    time.sleep(6.0)  # the trials' targets are up
    head.remove_node(lost, allow_graceful=False)
    runner.join(600)
    assert not runner.is_alive() and "outcome" in result
    run_id, ledger = result["outcome"].run_id, Ledger(path)
    failed = [r for r in ledger.probe_results(run_id) if r["key"].endswith("/attempt-1")]
    assert failed and all("node lost" in r["finding"] for r in failed), [r["finding"] for r in failed]
    assert all(r["feedback"]["details"]["node"].endswith(lost.node_id[:8]) for r in failed)
    trials = ledger.candidates(run_id)
    assert sorted(t["trial"] for t in trials) == [0, 1, 2, 3]  # nothing lost, nothing run twice
    for record in failed:
        retried = next(t for t in trials if f"trial/{t['trial']}/" in record["key"])
        assert retried["attempts"] == 2 and not retried["node"].endswith(lost.node_id[:8])
    assert ledger.run(run_id)["status"] == "completed"
    assert _no_targets_left(), "the lost node's trial left its targets running"


def test_an_attempt_placed_on_a_node_that_died_unnoticed_is_named_by_that_node(cluster) -> None:
    from infragent.agent.executors.ray_executor import _placed
    from infragent.agent.executors.remote_trial import TrialRunner

    head, _ = cluster
    doomed = head.add_node(num_cpus=1, resources={"doomed_node": 1})
    head.wait_for_nodes()
    head.remove_node(doomed, allow_graceful=False)  # Ray counts it alive until its heartbeats are missed
    actor = ray.remote(TrialRunner).options(num_cpus=1, resources={"doomed_node": 1}, max_restarts=0).remote()
    with pytest.raises(ray.exceptions.RayError):  # placed there, it never answers
        ray.get(actor.where.remote(), timeout=120)
    flight = SimpleNamespace(actor=actor, node=None, node_id=None)
    _placed(ray, flight)
    assert flight.node_id == doomed.node_id and flight.node.endswith(doomed.node_id[:8]), flight


def test_a_spec_the_node_lacks_travels_with_the_trial(tmp_path: Path) -> None:
    folder = tmp_path / "pack"
    folder.mkdir()
    spec = ray_spec(folder)
    (folder / "prompts.txt").write_text("hello\n")
    job = TrialJob(0, {}, Proposal(), None, str(tmp_path / "elsewhere" / "spec.toml"), "0" * 64, spec_files(spec),
                   Budget(), 0, "ladder")
    here = _spec_here(job, tmp_path / "node")
    assert here != spec and here.read_text() == spec.read_text() and (here.parent / "prompts.txt").exists()
    assert load_spec(here).target.resources.ray_demand() == {"CPU": 1.0, "infer_node": 1.0}


def test_bad_resources_and_executors_are_named(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(command_spec(SEQS, CONCURRENT).replace("hang_timeout_s", "resources = { custom = { gpu_node = 0 } }"
                                                           "\nhang_timeout_s", 1))
    with pytest.raises(SpecError, match=r"spec.toml:\d+: target.resources.custom: a trial needs a positive amount of gpu_node"):
        load_spec(spec)
    spec.write_text(command_spec(SEQS, CONCURRENT) + '\n[executor]\nkind = "slurm"\n')
    with pytest.raises(SpecError, match=r"executor.kind"):
        load_spec(spec)
    spec.write_text(command_spec(SEQS, CONCURRENT))
    done = subprocess.run([sys.executable, "-m", "infragent.cli", "optimize", str(spec), "--executor", "slurm"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SRC)})
    assert done.returncode != 0 and "--executor slurm: choose local or ray" in done.stdout + done.stderr


def test_a_patch_made_on_the_driver_applies_on_a_node_whose_code_came_without_the_repository(tmp_path: Path) -> None:
    """The driver's pack sits at pack/ in a git repository; a node has only the shipped folder. The patch's
    paths move to the node's root, equal files give equal trees, and a node with other code is told apart."""
    repo = tmp_path / "repo"
    (repo / "pack").mkdir(parents=True)
    (repo / "pack" / "workload.py").write_text("def f():\n    return 1\n")
    (repo / "pack" / "spec.toml").write_text("# spec\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "pack"], check=True)
    driver = Workspace.create(repo / "pack", tmp_path / "driver-home", "proposal")
    (driver.root / "workload.py").write_text("def f():\n    return 2\n")
    patch = driver.diff()
    assert "a/pack/workload.py" in patch and driver.code_prefix() == "pack"
    node_code = tmp_path / "node" / "spec"
    node_code.mkdir(parents=True)
    for name, data in spec_files(repo / "pack" / "spec.toml").items():
        (node_code / name).write_bytes(data)
    node = Workspace.create(node_code, tmp_path / "node-home", "trial-0")
    assert node.code_prefix() == "." and node.code_tree() == driver.code_tree()
    node.apply(patch, driver.code_prefix())
    assert (node.root / "workload.py").read_text() == "def f():\n    return 2\n"
    (node_code / "workload.py").write_text("def f():\n    return 3\n")  # another node, other code
    other = Workspace.create(node_code, tmp_path / "other-home", "trial-0")
    assert other.code_tree() != driver.code_tree()
    with pytest.raises(WorkspaceError, match="outside the code folder pack"):
        other.apply(patch.replace("pack/workload.py", "elsewhere.py"), driver.code_prefix())
    for ws in (driver, node, other):
        ws.remove()
