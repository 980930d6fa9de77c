"""Command targets as a new user runs them: `infragent serve` as a black box behind a launch command with
{port}. Every launch is its own process group on its own port (the ledger shows it), a misbehaving
candidate is reported as what it did and never measured, and a knob with a real effect is found."""
from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import pytest

from infragent.agent.context import Budget
from infragent.agent.core import optimize
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Target
from infragent.lab.target import TargetDied, TargetError, TargetProcess, free_port, require_own_ports
from server_fixture import CONCURRENT, TINY_HYBRID, WIDE_HYBRID

FLAKY = Path(__file__).resolve().parent / "flaky_server.py"


def command_spec(knobs: str, scenario: str, behaviour: str = "ok", hang_s: float = 60,
                 hybrid: dict = TINY_HYBRID) -> str:
    """A command-target spec: a hybrid model served by flaky_server.py (plain `infragent serve` when ok)."""
    hybrid_json = json.dumps(hybrid).replace("{", "{{").replace("}", "}}")  # literal braces in a format string
    return f"""
[target]
kind = "command"
command = '''{sys.executable} {FLAKY} --behaviour {behaviour} --port {{port}} --model hybrid
  --hybrid-config '{hybrid_json}' --max-model-len 512 --kv-cache-gb 0.05 --threads 1 --max-num-seqs {{max_num_seqs}}'''
base_url = "http://127.0.0.1:{{port}}"
ready_url = "http://127.0.0.1:{{port}}/health"
ready_timeout_s = 60
hang_timeout_s = {hang_s}
{knobs}
{scenario}
"""


SEQS = """
[knobs.max_num_seqs]
type = "int"
domain = [1, 8]
default = 1
touches = ["decode"]
"""
def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def test_each_launch_has_its_own_port_and_group_and_a_real_effect_is_found(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    spec.write_text(command_spec(SEQS, CONCURRENT, hybrid=WIDE_HYBRID))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    outcome = optimize(spec, ledger, Budget(probes=7, minutes=6), log=print)
    launches = ledger.launches(outcome.run_id)
    roles = [launch["role"] for launch in launches]
    assert roles[0] == "baseline" and any(r.startswith("trial/") for r in roles)
    assert roles.index("baseline-twin") == roles.index("trial/0") + 1  # the A/A floor: when a local A/B first needs it
    assert len({launch["pgid"] for launch in launches}) == len(launches)
    assert len({launch["port"] for launch in launches}) == len(launches)
    assert all(launch["stopped"] is not None and _group_gone(launch["pgid"]) for launch in launches)
    for launch in launches:  # the port in the ledger is the one the command was given
        assert str(launch["port"]) in launch["argv"]
    assert outcome.best is not None and outcome.best["knobs"]["max_num_seqs"] > 1, outcome.trials
    results = {r["key"]: r for r in ledger.probe_results(outcome.run_id)}
    assert results["calibration/aa"]["numbers"]["aa_floor"] > 0
    assert ledger.run(outcome.run_id)["status"] == "completed"


BEHAVIOUR = """
[knobs.max_num_seqs]
type = "int"
domain = [2, 2]
default = 2

[knobs.behaviour]
type = "choice"
domain = ["ok", "exit-after-ready", "hang-after-ready", "no-bind"]
default = "ok"
"""


def test_a_candidate_that_cannot_bind_exits_or_hangs_is_reported_and_never_measured(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    decoys = tmp_path / "decoys"
    monkeypatch.setenv("FLAKY_DECOY_PIDS", str(decoys))
    spec = tmp_path / "spec.toml"
    spec.write_text(command_spec(BEHAVIOUR, CONCURRENT.replace("num_prompts = 16", "num_prompts = 8"),
                                 behaviour="{behaviour}", hang_s=4))
    ledger = Ledger(tmp_path / "ledger.sqlite")
    try:
        outcome = optimize(spec, ledger, Budget(probes=12, minutes=5), log=print)
    finally:
        for pid in decoys.read_text().split() if decoys.exists() else []:
            os.kill(int(pid), signal.SIGKILL)
    by_behaviour = {t["knobs"]["behaviour"]: t for t in outcome.trials}
    assert len(outcome.trials) == 3 and "every combination of the searched knobs was tried" in outcome.limits
    assert {"exit-after-ready", "hang-after-ready", "no-bind"} <= by_behaviour.keys(), outcome.trials
    assert by_behaviour["no-bind"]["status"] == "not started" and "could not bind" in by_behaviour["no-bind"]["why"]
    assert by_behaviour["exit-after-ready"]["status"] == "target died"
    died = by_behaviour["exit-after-ready"]["why"]  # the server went first (port closed) or the wrapper did
    assert died.startswith("target died: ") and ("exited with status" in died or "listens on port" in died), died
    assert by_behaviour["hang-after-ready"]["status"] == "target died"
    assert "hung" in by_behaviour["hang-after-ready"]["why"]
    keys = [r["key"] for r in ledger.probe_results(outcome.run_id)]
    for behaviour in ("exit-after-ready", "hang-after-ready", "no-bind"):
        trial = by_behaviour[behaviour]["trial"]
        assert f"trial/{trial}/e2e" not in keys  # never measured end to end
        assert not any(k.startswith(f"trial/{trial}/c8") for k in keys)
    assert all(_group_gone(launch["pgid"]) for launch in ledger.launches(outcome.run_id))


def test_readiness_is_proven_by_the_listening_socket(tmp_path: Path) -> None:
    port = free_port()
    decoy = TargetProcess(Target(kind="command", command=f"{sys.executable} {FLAKY} --behaviour decoy --port {port}",
                                 base_url=f"http://127.0.0.1:{port}", ready_url=f"http://127.0.0.1:{port}/health"),
                          {}, tmp_path / "decoy.log").start()
    try:
        # a second server told to use the same fixed port: the decoy answers, the launch is refused
        fixed = Target(kind="command", command=f"{sys.executable} -c 'import time; time.sleep(60)'",
                       base_url=f"http://127.0.0.1:{port}", ready_url=f"http://127.0.0.1:{port}/health")
        with pytest.raises(TargetError, match="could not bind its port"):
            TargetProcess(fixed, {}, tmp_path / "fixed.log").start()
        with pytest.raises(TargetError, match=r"no \{port\}.*two instances"):
            require_own_ports(fixed, "optimize runs two at once")
        hung = Target(kind="command", command=f"{sys.executable} -c 'import time; time.sleep(60)' {{port}}",
                      base_url="http://127.0.0.1:{port}", ready_url="http://127.0.0.1:{port}/health",
                      ready_timeout_s=1.5)
        with pytest.raises(TargetError, match="target hung: not ready"):
            TargetProcess(hung, {}, tmp_path / "hung.log").start()
        missing = Target(kind="command", command="no-such-server-binary --port {port}",
                         base_url="http://127.0.0.1:{port}", ready_url="http://127.0.0.1:{port}/health")
        with pytest.raises(TargetError, match="cannot launch the target: 'no-such-server-binary'"):
            TargetProcess(missing, {}, tmp_path / "missing.log").start()
        unchecked = fixed.model_copy(update={"listener_check": False})  # a container's proxy owns the socket
        with pytest.raises(TargetError, match="in use before the launch"):
            TargetProcess(unchecked, {}, tmp_path / "unchecked.log").start()
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
        decoy.check_alive()
        os.kill(decoy.pgid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while decoy.proc.poll() is None and time.monotonic() < deadline:  # until the kill has landed
            time.sleep(0.02)
        with pytest.raises(TargetDied, match="exited with status"):
            decoy.check_alive()
    finally:
        decoy.stop()


EIGHT = SEQS.replace("domain = [1, 8]", "domain = [8, 8]")


def _signal_masks(pid: int) -> str:
    """The process's blocked, ignored and caught signal masks (/proc/PID/status), as one line."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError as err:
        return f"no status for pid {pid}: {err}"
    return "; ".join(line for line in lines if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")))


def _in_phase(ledger_path: Path, phase: str) -> bool:
    """Whether the run in this ledger is in the phase now (from what it has recorded so far)."""
    if not ledger_path.exists():
        return False
    try:
        ledger = Ledger(ledger_path)
        launches = ledger.launches(1)
        keys = {r["key"]: r["verdict"] for r in ledger.probe_results(1)}
    except Exception:  # noqa: BLE001 (the run is creating the file and its tables)
        return False
    if phase == "readiness":
        return any(launch["status"] == "launched" for launch in launches)
    if phase == "probe":
        return any(launch["role"] == "baseline-twin" and launch["status"] == "ready" for launch in launches)
    # end to end (the run goes there without a local A/B): the candidate is up and its e2e not yet recorded
    return any(launch["role"].startswith("trial/") and launch["status"] == "ready" for launch in launches) and \
        not any(k.endswith("/e2e") for k in keys)


@pytest.mark.parametrize("sig, phase", [(signal.SIGINT, "readiness"), (signal.SIGTERM, "probe"),
                                        (signal.SIGTERM, "end_to_end"), (signal.SIGINT, "end_to_end")])
def test_an_interrupt_in_any_phase_leaves_no_process_and_the_run_resumable(tmp_path: Path, sig: int,
                                                                           phase: str) -> None:
    import subprocess

    spec, ledger_path = tmp_path / "spec.toml", tmp_path / "ledger.sqlite"
    spec.write_text(command_spec(EIGHT, CONCURRENT))
    argv = [sys.executable, "-m", "infragent.cli", "optimize", str(spec), "--ledger", str(ledger_path),
            "--budget-probes", "6", "--budget-minutes", "4"]
    if phase == "end_to_end":  # straight there: whether the candidate wins locally depends on the machine's load
        argv += ["--feedback", "e2e-only"]
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 240
    while not _in_phase(ledger_path, phase):
        assert proc.poll() is None and time.monotonic() < deadline, f"never reached {phase}: {proc.stdout.read()}"
        time.sleep(0.05)
    masks = _signal_masks(proc.pid)  # evidence if the signal goes unheard (SigIgn: ignored since its start)
    proc.send_signal(sig)
    output = proc.communicate(timeout=90)[0]
    assert proc.returncode == 130, f"{masks}\n{output[-3000:]}"
    assert "Traceback" not in output, output[-3000:]
    ledger = Ledger(ledger_path)
    launches = ledger.launches(1)
    assert launches and all(_group_gone(launch["pgid"]) for launch in launches), launches
    assert all(launch["stopped"] is not None for launch in launches)
    run = ledger.run(1)
    assert run["status"] == "interrupted" and "--resume 1" in run["note"], run
    assert "run 1 interrupted" in output
    if sig == signal.SIGINT and phase == "end_to_end":  # and it continues where it stopped
        resumed = subprocess.run(argv + ["--resume", "1"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
        assert ledger.run(1)["status"] == "completed"
        assert all(_group_gone(launch["pgid"]) for launch in ledger.launches(1))


def test_the_readme_command_target_spec_is_valid_and_a_portless_command_is_refused(tmp_path: Path) -> None:
    from infragent.lab.spec import SpecError, load_spec, plan

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = "# vllm.toml" + readme.split("```toml\n# vllm.toml", 1)[1].split("```", 1)[0]
    (tmp_path / "vllm.toml").write_text(block)
    spec = load_spec(tmp_path / "vllm.toml")
    assert spec.target.kind == "command" and "{port}" in spec.target.command
    assert not any(line.startswith("refused") for line in plan(spec))
    assert "diagnose the baseline's launch from outside" in " ".join(plan(spec))
    portless = block.replace(" --port {port}", "").replace("{port}", "8000")
    (tmp_path / "portless.toml").write_text(portless)
    assert any(line.startswith("refused: [target] command has no {port}") for line in plan(load_spec(tmp_path / "portless.toml")))
    with pytest.raises(TargetError, match="no {port}"):
        optimize(tmp_path / "portless.toml", Ledger(tmp_path / "l.sqlite"), Budget(probes=2, minutes=1), log=print)
    (tmp_path / "half.toml").write_text(block.replace(" --port {port}", ""))
    with pytest.raises(SpecError, match="never receives it"):
        load_spec(tmp_path / "half.toml")


def test_show_lists_each_launch_with_its_group_and_port(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from infragent.cli import app

    ledger = Ledger(tmp_path / "ledger.sqlite")
    run = ledger.start_run("optimize", "spec.toml", "x", None)
    first = ledger.record_launch(run, "baseline", 4242, 8001, ["serve", "--port", "8001"], None, time.time())
    ledger.record_launch(run, "trial/0", 4343, 8002, ["serve", "--port", "8002"], None, time.time())
    ledger.set_launch(first, status="ready")
    ledger.set_run(run, status="interrupted", note="interrupted (signal 15); continue with ... --resume 1")
    shown = CliRunner().invoke(app, ["show", str(run), "--ledger", str(tmp_path / "ledger.sqlite")])
    assert "launch baseline         process group 4242, port 8001: ready" in shown.output
    assert "launch trial/0          process group 4343, port 8002: launched" in shown.output
    assert "note: interrupted (signal 15)" in shown.output
    listed = CliRunner().invoke(app, ["runs", "--ledger", str(tmp_path / "ledger.sqlite")])
    assert "interrupted" in listed.output and "--resume 1" in listed.output


def test_signals_held_while_stopping_arrive_once_the_outermost_block_ends() -> None:
    from infragent.lab.target import held_signals

    reached = []
    with pytest.raises(KeyboardInterrupt, match="signal 15"):
        with held_signals():
            with held_signals():  # stop() inside launched()'s cleanup: nested, still held
                os.kill(os.getpid(), signal.SIGTERM)
                reached.append("inner")
            reached.append("outer")  # the launch is recorded as stopped before the interrupt goes on
    assert reached == ["inner", "outer"] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


ACTING = """
[knobs.max_num_seqs]
type = "int"
domain = [1, 8]
default = 1
acts_on = ["batch_limit"]

[knobs.max_num_batched_tokens]
type = "int"
domain = [64, 512]
default = 512
acts_on = ["prefill_chunk"]
"""


def test_a_command_target_is_diagnosed_from_outside_and_the_search_turns_the_knob_that_acts(tmp_path: Path) -> None:
    spec = tmp_path / "spec.toml"
    text = command_spec(ACTING, CONCURRENT)
    spec.write_text(text.replace("--max-num-seqs {max_num_seqs}",
                                 "--max-num-seqs {max_num_seqs} --max-num-batched-tokens {max_num_batched_tokens}"))
    ledger, lines = Ledger(tmp_path / "ledger.sqlite"), []
    outcome = optimize(spec, ledger, Budget(probes=3, minutes=5), log=lines.append)
    results = {r["key"]: r for r in ledger.probe_results(outcome.run_id)}
    diagnosis = results["ladder/diagnose"]
    assert "held at 1 (--max-num-seqs 1 on the launch line)" in diagnosis["finding"], diagnosis["finding"]
    aimed = [h for h in outcome.hypotheses if h.knobs == ["max_num_seqs"]]
    assert aimed and "queueing-bound" in aimed[0].claim and aimed[0].spans == ["batch_limit"]
    assert any(line.startswith("searching max_num_seqs (") for line in lines), lines
    first = outcome.trials[0]["knobs"]
    assert first["max_num_seqs"] > 1 and first["max_num_batched_tokens"] == 512, outcome.trials


def test_the_packs_commands_name_the_interpreter_and_their_own_folder() -> None:
    from infragent.lab.spec import PACKS, load_spec
    from infragent.lab.target import launch_command

    spec = load_spec(PACKS / "llamacpp-server" / "spec.toml")
    assert str(PACKS / "llamacpp-server") in spec.target.command and "{spec_dir}" not in spec.target.command
    argv, url, ready = launch_command(spec.target, {n: k.default for n, k in spec.knobs.items()})
    assert argv[0] == sys.executable and argv[1].endswith("llamacpp-server/llamacpp_server.py")
    assert "--interrupt_requests" in argv and ready.startswith(url)
    served = load_spec(PACKS / "serve-command" / "spec.toml")
    argv, _, _ = launch_command(served.target, {n: k.default for n, k in served.knobs.items()})
    assert argv[:3] == [sys.executable, "-m", "infragent.cli"] and "--max-num-seqs" in argv


def test_the_diagnosis_pulls_the_playbooks_batch_move_ahead_of_the_guides_order(tmp_path: Path) -> None:
    from infragent.agent.proposers.playbook import PlaybookProposer
    from infragent.lab.spec import load_spec

    spec = tmp_path / "spec.toml"
    text = command_spec(ACTING, CONCURRENT).replace(
        "--max-num-seqs {max_num_seqs}",
        "--max-num-seqs {max_num_seqs} --max-num-batched-tokens {max_num_batched_tokens}")
    spec.write_text(text + "\n[[playbook]]\nknobs = { max_num_batched_tokens = 64 }\n\n"
                           "[[playbook]]\nknobs = { max_num_seqs = 4 }\nwhy = \"a larger batch\"\n")
    ledger, lines = Ledger(tmp_path / "ledger.sqlite"), []
    outcome = optimize(spec, ledger, Budget(probes=3, minutes=5), PlaybookProposer(load_spec(spec).playbook),
                       log=lines.append)
    first = outcome.trials[0]
    assert first["knobs"] == {"max_num_seqs": 4, "max_num_batched_tokens": 512}, outcome.trials
    assert first["rationale"].startswith("playbook move 2: max_num_seqs = 4 (a larger batch); it acts on hypothesis/")
