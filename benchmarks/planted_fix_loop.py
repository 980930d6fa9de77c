"""End to end through the loop: a waste planted in the engine, and a proposer whose first patch is the exact fix
and whose next ones are no-op patches (a comment). Every run is a fresh planted checkout and one `optimize`
(seed = the run's number), with the gates the loop always runs: check, step bench, local A/B, end to end.
The fix must be accepted in every run, a no-op never.

- --case sleep: a sleep of --sleep-ms at the top of every engine step (about 10% of a llama step here), in
  no child span; --proposer command: a program that removes it.
- --case sample: an unused log-softmax and sort over the whole vocabulary in the runner's 'sample' span;
  --proposer llm: a scripted model (tests/scripted_llm.py) that calls `record`, deletes the line with
  edit_file, runs the gates and finishes, through the LLM proposer's tools and an OpenAI-compatible server.

    PYTHONPATH=src .venv/bin/python benchmarks/planted_fix_loop.py [--case sleep|sample]
        [--proposer command|llm] [--runs 10] [--sleep-ms 4.5] [--noops 1] [--json FILE]

Prints a line per run (what each trial's gates said, the probes charged, the wall seconds) and the counts.
Run alone: two cores, and this times things.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from engine_checkout import RUNNER, SAMPLE_LINE, git, planted_checkout  # noqa: E402
from infragent.agent.proposers.command import CommandProposer  # noqa: E402
from infragent.agent.context import Budget  # noqa: E402
from infragent.agent.core import optimize  # noqa: E402
from infragent.agent.proposers.llm import LLMProposer  # noqa: E402
from infragent.lab.ledger import Ledger  # noqa: E402
from ladder_ablation import planted_spec  # noqa: E402
from scripted_llm import ScriptedLLM  # noqa: E402

ENGINE = "src/infragent/engine/llm_engine.py"
STEP_LINE = '        with span("step"):\n'
WASTE = "                _unused = logits.float().log_softmax(-1).sort(dim=-1, descending=True)  # planted: unused\n"
NOOP = "        # a comment: a patch that changes nothing\n"


def sleep_line(ms: float) -> str:
    """The planted line: a sleep at the top of every engine step."""
    return f"        __import__('time').sleep({ms / 1000!r})  # planted: time in no child span\n"


def planted(dest: Path, case: str, ms: float) -> tuple[str, str]:
    """The planted checkout of engine_checkout with its LM-head slowdown replaced by this case's waste;
    (the file, the planted text) that the fix removes."""
    planted_checkout(dest)
    git(["checkout", "-q", "HEAD~1", "--", RUNNER], dest)  # the LM-head plant undone
    path, anchor, text = (ENGINE, STEP_LINE, sleep_line(ms)) if case == "sleep" else (RUNNER, SAMPLE_LINE, WASTE)
    code = (dest / path).read_text()
    assert anchor in code, f"{path} moved: update benchmarks/planted_fix_loop.py"
    (dest / path).write_text(code.replace(anchor, text + anchor if case == "sleep" else anchor + text, 1))
    git(["commit", "-q", "-am", f"planted: {case}"], dest)
    return path, text


def command_proposer(folder: Path, path: str, plant: str) -> CommandProposer:
    """A proposer program: its first call removes the plant, every later call adds a comment to the engine."""
    script = folder / "propose.py"
    script.write_text(f'''import json, pathlib, sys
context = json.load(sys.stdin)
counter = pathlib.Path({str(script.with_suffix(".calls"))!r})
n = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(n + 1))
root = pathlib.Path(context["workspace"])
if n == 0:
    target = root / {path!r}
    target.write_text(target.read_text().replace({plant!r}, ""))
    print(json.dumps({{"rationale": "fix: remove the planted waste"}}))
else:
    target = root / {ENGINE!r}
    target.write_text(target.read_text().replace({STEP_LINE!r}, {NOOP!r} + {STEP_LINE!r}, 1))
    print(json.dumps({{"rationale": "no-op: a comment"}}))
''')
    return CommandProposer([sys.executable, str(script)])


def llm_script(path: str, plant: str, noops: int) -> list:
    """The scripted model's turns: record, delete the plant, gates, finish; then a comment and finish per no-op."""
    fix = [[{"name": "run_probe", "arguments": {"name": "record"}}],
           [{"name": "edit_file", "arguments": {"path": path, "old": plant, "new": ""}}],
           [{"name": "run_probe", "arguments": {"name": "gates"}}],
           [{"name": "finish", "arguments": {"rationale": "an unused log-softmax and sort over the vocabulary "
                                                          "in sample()"}}]]
    noop = [[{"name": "edit_file", "arguments": {"path": ENGINE, "old": STEP_LINE, "new": NOOP + STEP_LINE}}],
            [{"name": "finish", "arguments": {"rationale": "no-op: a comment"}}]]
    return fix + noop * noops


def one_run(run: int, case: str, kind: str, ms: float, noops: int, home: Path) -> dict:
    """A fresh checkout, one optimize; the trials' statuses and what decided them."""
    folder = home / f"run-{run}"
    folder.mkdir(parents=True)
    path, plant = planted(folder / "checkout", case, ms)
    (folder / "spec.toml").write_text(planted_spec("llama"))
    ledger = Ledger(folder / "ledger.sqlite")
    budget = Budget(probes=12 + 6 * noops + (6 if kind == "llm" else 0), minutes=30, trials=1 + noops)
    started = time.monotonic()
    if kind == "llm":
        with ScriptedLLM(llm_script(path, plant, noops)) as llm:
            proposer = LLMProposer(base_url=llm.base_url, model="scripted", api_key="")
            outcome = optimize(folder / "spec.toml", ledger, budget, proposer, log=lambda _: None, seed=run)
    else:
        outcome = optimize(folder / "spec.toml", ledger, budget, command_proposer(folder, path, plant),
                           log=lambda _: None, seed=run)
    seconds = time.monotonic() - started
    trials = [{"trial": t["trial"], "kind": "fix" if t["trial"] == 0 else "no-op", "status": t["status"],
               "feasible": t.get("feasible"), "why": t.get("why", "")[:300]} for t in outcome.trials]
    accepted = [t for t in trials if t["status"] == "measured" and t["feasible"]]
    records = ledger.probe_results(outcome.run_id)
    return {"run": run, "fix_accepted": any(t["kind"] == "fix" for t in accepted),
            "noop_accepted": sum(t["kind"] == "no-op" for t in accepted),
            "best": outcome.best["trial"] if outcome.best else None, "trials": trials,
            "gates": [f"{r['key']}: {r['verdict']}: {r['feedback']['finding'][:160]}" for r in records
                      if r["key"].startswith("trial/") and "/tool/" not in r["key"]],
            "probes": sum(1 for r in records if r["feedback"]["details"].get("charged", True)),
            "wall_s": round(seconds, 1)}


def main() -> None:
    """The runs, a line each, and the counts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--case", choices=["sleep", "sample"], default="sleep")
    parser.add_argument("--proposer", choices=["command", "llm"], default="command")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--sleep-ms", type=float, default=4.5)
    parser.add_argument("--noops", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out = args.json or ROOT / "benchmarks" / "results" / f"planted_fix_loop-{args.case}-{args.proposer}.json"
    home = Path(tempfile.mkdtemp(prefix="planted-fix-"))
    rows = []
    for run in range(args.runs):
        row = one_run(run, args.case, args.proposer, args.sleep_ms, args.noops, home)
        rows.append(row)
        said = "; ".join(f"{t['kind']} {t['status']}{' feasible' if t['feasible'] else ''}: {t['why'][:120]}"
                         for t in row["trials"])
        print(f"run {run}: fix {'ACCEPTED' if row['fix_accepted'] else 'not accepted'}, no-ops accepted "
              f"{row['noop_accepted']}, {row['probes']} probes, {row['wall_s']:.0f} s | {said}", flush=True)
        out.write_text(json.dumps({"case": args.case, "proposer": args.proposer, "sleep_ms": args.sleep_ms,
                                   "rows": rows}, indent=1))
    fixes = sum(r["fix_accepted"] for r in rows)
    noops = sum(r["noop_accepted"] for r in rows)
    walls = sorted(r["wall_s"] for r in rows)
    print(f"fix accepted in {fixes}/{len(rows)} runs; no-op patches accepted {noops} times in "
          f"{len(rows) * args.noops}; wall per run median {walls[len(walls) // 2]:.0f} s (min {walls[0]:.0f}, "
          f"max {walls[-1]:.0f})")


if __name__ == "__main__":
    main()
