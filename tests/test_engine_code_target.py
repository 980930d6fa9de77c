"""The agent changes the engine's own code: a spec targets a git checkout of this project (code = ...) with a
slowdown planted in the decode path; a command proposer's patches run from their own worktrees. The fast
but wrong patch is rejected at the output check, the fix is accepted end to end against the interleaved
baseline and exported, and the checkout is byte-identical afterwards."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine_checkout import fingerprint, planted_checkout, proposer_script
from infragent.agent.proposers.command import CommandProposer
from infragent.agent.context import Budget
from infragent.agent.core import optimize
from infragent.lab.ledger import Ledger
from server_fixture import TINY_HYBRID

SPEC = f"""
[target]
kind = "engine"
model = "hybrid"
code = "checkout"
tests = "python -c 'import infragent.engine.runner'"
serve_args = ["--hybrid-config", '{json.dumps(TINY_HYBRID)}', "--max-model-len", "512", "--kv-cache-gb", "0.05",
              "--threads", "1", "--max-num-seqs", "4"]

[[scenarios]]
name = "s"
num_prompts = 8
max_concurrency = 4
random_input_len = 48
random_output_len = 24
repeats = 2

[[criteria]]
scenario = "s"
metric = "tpot_median_ms"
max_regression = 0.05
"""


def test_an_engine_patch_is_accepted_end_to_end_and_a_wrong_one_rejected_at_the_check(tmp_path: Path) -> None:
    checkout = planted_checkout(tmp_path / "checkout")
    before = fingerprint(checkout)
    (tmp_path / "spec.toml").write_text(SPEC)
    script = proposer_script(tmp_path / "propose.py", ["wrong", "fix"])
    ledger = Ledger(tmp_path / "ledger.sqlite")
    outcome = optimize(tmp_path / "spec.toml", ledger, Budget(probes=24, minutes=8),
                       CommandProposer([sys.executable, str(script)]), log=print)
    wrong, fix = outcome.trials[:2]
    records = {r["key"]: r for r in ledger.probe_results(outcome.run_id)}
    assert wrong["status"] == "rejected" and wrong["why"].startswith("check: greedy tokens differ"), wrong
    assert records["trial/0/tests"]["verdict"] == "pass" and "trial/0/step_bench" not in records
    assert fix["status"] == "measured" and fix["feasible"], fix
    assert records["trial/1/step_bench"]["verdict"] == "pass"  # a real win in seconds, before any server
    e2e = records["trial/1/e2e"]["feedback"]
    assert e2e["verdict"] == "pass"
    base, cand = e2e["numbers"]["objective_baseline"], e2e["numbers"]["objective_candidate"]
    assert cand["ci_low"] > base["ci_high"], e2e["finding"]  # more output tokens/s than the interleaved baseline
    # the diagnosis traced the baseline's worktree (the planted code), not the installed package
    traced = records["ladder/trace"]["feedback"]["locality"]["code"]
    assert "/workspaces/worktrees/" in traced and "baseline" in traced, traced
    # the servers ran the worktrees' code: the baseline's worktree and the candidate's, never the checkout
    launches = {launch["role"]: launch for launch in ledger.launches(outcome.run_id)}
    for role in ("baseline", "trial/1"):
        log = Path(launches[role]["log_path"]).read_text()
        code = next(line for line in log.splitlines() if "engine code:" in line).split("engine code: ")[1]
        assert "/workspaces/worktrees/" in code and str(checkout) not in code, code
    patch = Path(fix["exported"]).read_text()
    assert patch == fix["patch"] and "-                    for _ in range(3):" in patch
    evidence = json.loads(Path(fix["exported"]).with_suffix("").with_suffix(".evidence.json").read_text())
    assert "trial/1/e2e" in evidence["records"]
    assert fingerprint(checkout) == before  # files, HEAD, branches and index untouched
    subprocess.run(["git", "apply", "--check", fix["exported"]], cwd=checkout, check=True)


def test_the_llm_proposer_works_an_engine_worktree_through_charged_probes(tmp_path: Path) -> None:
    from engine_checkout import PLANTED, RUNNER
    from infragent.agent.proposers.llm import LLMProposer
    from scripted_llm import ScriptedLLM

    checkout = planted_checkout(tmp_path / "checkout")
    before = fingerprint(checkout)
    (tmp_path / "spec.toml").write_text(SPEC)
    script = [
        [{"name": "run_probe", "arguments": {"name": "record"}}],  # where does the worktree's engine spend time?
        [{"name": "edit_file", "arguments": {"path": RUNNER, "old": PLANTED, "new": ""}}],
        [{"name": "run_probe", "arguments": {"name": "gates"}}],
        [{"name": "finish", "arguments": {"rationale": "the LM head ran three extra times per decode step"}}],
    ]
    ledger = Ledger(tmp_path / "ledger.sqlite")
    with ScriptedLLM(script) as llm:
        proposer = LLMProposer(base_url=llm.base_url, model="scripted", api_key="")
        outcome = optimize(tmp_path / "spec.toml", ledger, Budget(probes=11, minutes=8), proposer, log=print)
        offered = llm.requests[0]
    trial = outcome.trials[0]
    assert trial["status"] == "measured" and trial["feasible"] and trial["proposer"] == "llm", trial
    records = {r["key"]: r for r in ledger.probe_results(outcome.run_id)}
    assert records["trial/0/tool/record"]["probe"] == "analyze" and "sample" in records["trial/0/tool/record"]["finding"]
    assert "top spans by own time: " in records["trial/0/tool/record"]["finding"]
    assert "; in no child span: " in records["trial/0/tool/record"]["finding"]
    assert records["trial/0/tool/gates"]["verdict"] == "pass"
    assert all(records[k]["feedback"]["details"].get("charged", True) for k in ("trial/0/tool/record", "trial/0/tool/gates"))
    transcript = records["trial/0/proposal"]["feedback"]["details"]["transcript"]
    tool_results = [m["content"] for m in transcript if m["role"] == "tool"]
    assert tool_results[0].startswith("[analyze]") and "[gates] PASS" in tool_results[2]
    # the tools its prompt names are the tools it has
    run_probe = next(t for t in offered["tools"] if t["function"]["name"] == "run_probe")
    names = run_probe["function"]["parameters"]["properties"]["name"]["enum"]
    assert set(names) == {"check", "bench", "record", "gil", "gates", "scenario"}
    assert all(name in offered["messages"][0]["content"] for name in names)
    assert fingerprint(checkout) == before
