"""The discipline, measured: the same proposer and seed under the cheapest-first ladder and under
--feedback e2e-only, side by side — probes run, wall seconds to the first correct diagnosis, wall seconds to
the accepted fix, and wrong acceptances.

    PYTHONPATH=src .venv/bin/python benchmarks/ladder_ablation.py [--model llama] [--packs NAME ...]
        [--proposer search|playbook] [--repeats N] [--json results.json]

serve-command (--packs serve-command) is a command target: our server as a black box with its batch limit
planted too low; there a wrong acceptance is any accepted trial that leaves max_num_seqs at 2 or below.
Every case also counts the acceptances without a measured gain: an accepted trial whose end-to-end objective
ratio (candidate/baseline, 95% CI) reaches down to 1 or below, such as a neutral change the regression-only
criteria let through. --proposer playbook runs the pack's [[playbook]] moves (a guide's order; a diagnosis
pulls the moves on its hypotheses' knobs forward) instead of the search.

The scripted case: a git checkout of this project with a slowdown planted in the engine's decode path (the
LM head run three extra times per decode step), and a command proposer that offers, in order, a patch that
breaks outputs, two that are slower, one that is neutral, and the real fix. A run of the ladder with a
budget the fix fits in, then the same sequence under e2e-only. The packs (--packs) run the search (or playbook)
proposer under both modes with the pack's own budget. --repeats N runs every case N times, the modes in ABBA order
(ladder, e2e-only, e2e-only, ladder, ...) so drift on the machine falls on both, and prints the ratio of each
repeat next to the ratio of the medians. Run alone: two cores, and this times things.
"""
from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the planted checkout is shared with the tests

from engine_checkout import planted_checkout, proposer_script  # noqa: E402
from infragent.agent.proposers.command import CommandProposer  # noqa: E402
from infragent.agent.proposers.playbook import PlaybookProposer  # noqa: E402
from infragent.agent.context import Budget  # noqa: E402
from infragent.agent.core import Outcome, optimize  # noqa: E402
from infragent.lab.ledger import Ledger  # noqa: E402
from infragent.lab.spec import PACKS, load_spec  # noqa: E402
from infragent.analysis.blocks import block_estimate  # noqa: E402
from infragent.lab.trajectory import probes_until  # noqa: E402

SEQUENCE = ["wrong", "slower", "slower2", "neutral", "fix"]
TINY_HYBRID = '{"hidden_size": 128, "intermediate_size": 256, "num_layers": 4, "num_heads": 4, "num_kv_heads": 2, ' \
              '"head_dim": 32, "kda_num_heads": 4, "kda_head_k_dim": 32, "kda_head_v_dim": 32}'
CAUSES = {  # words the supported hypothesis must say for a correct diagnosis (any one of the lists)
    "planted": [["'sample'"]],
    "tp-precision": [["shards", "column:2", "bf16 operands"]],
    "kda-decode-padding": [["the FP32 work in", "kda.qk_norm", "kda.gate", "redone in every kda.v_tile"]],
    "kv-transfer-gil": [["kv-transfer", "starved of the GIL", "never overlap"]],
    "engine-slo": [["prefill is cut into chunks of 32 tokens"], ["requests wait for a slot", "max_num_seqs = 2"]],
    "quant-gates": [["quantization = 'w8a8' costs quality", "perplexity_increase"]],
    "serve-command": [["queueing-bound", "--max-num-seqs 2 on the launch line"]],
}
FIXES = {  # a pack whose planted cause is known: the trials that fix it (any other accepted trial is wrong)
    "serve-command": lambda knobs: knobs["max_num_seqs"] > 2,
}


def planted_spec(model: str) -> str:
    """The planted checkout's spec: a realistic small scenario, TPOT and throughput criteria."""
    args = ['"--max-model-len", "1024", "--max-num-seqs", "4"']
    if model == "hybrid":
        args.append(f"\"--hybrid-config\", '{TINY_HYBRID}'")
    return f"""
[target]
kind = "engine"
model = "{model}"
code = "checkout"
serve_args = [{", ".join(args)}]

[[scenarios]]
name = "chat"
num_prompts = 16
max_concurrency = 4
random_input_len = 128
random_output_len = 32
length_dist = "uniform"
random_range_ratio = 0.5
repeats = 3

[[criteria]]
scenario = "chat"
metric = "tpot_median_ms"
max_regression = 0.02

[[criteria]]
scenario = "chat"
metric = "output_tok_s"
max_regression = 0.02
"""


def figures(outcome: Outcome, ledger: Ledger, seconds: float, causes: list[list[str]] | None,
            kinds: list[str] | None = None, fixes: Callable[[dict], bool] | None = None) -> dict:
    """Probes run, seconds to the first correct diagnosis (a hypothesis naming the cause, posed or settled, and
    never refuted) and to the accepted fix, wrong acceptances."""
    refuted = {h["key"] for h in ledger.hypotheses(outcome.run_id) if h["status"] == "refuted"}
    causes = causes or []
    diagnosed = next((at for at, what in outcome.events if what.startswith("hypothesis/")
                      and what.split(" ")[0] not in refuted and any(all(w in what for w in c) for c in causes)), None)
    events = {what: at for at, what in reversed(outcome.events)}
    named = min((n for c in causes for n in [probes_until(ledger, outcome.run_id, c)] if n is not None),
                default=None, key=lambda found: found[0])
    accepted = [t for t in outcome.trials if t["status"] == "measured" and t["feasible"]]
    if kinds is not None:  # the scripted case: every acceptance but the fix is wrong
        wrong = [t for t in accepted if kinds[min(t["trial"], len(kinds) - 1)] != "fix"]
        fix_at = next((events.get(f"trial/{t['trial']} accepted") for t in accepted
                       if kinds[min(t["trial"], len(kinds) - 1)] == "fix"), None)
    elif fixes is not None:  # a pack with a known planted cause: accepting anything that leaves it is wrong
        wrong = [t for t in accepted if not fixes(t["knobs"])]
        fix_at = next((events.get(f"trial/{t['trial']} accepted") for t in accepted if fixes(t["knobs"])), None)
    else:  # a pack: the best feasible trial is the fix; no wrong answer is known in advance
        wrong, fix_at = [], (events.get(f"trial/{outcome.best['trial']} accepted") if outcome.best else None)
    records = ledger.probe_results(outcome.run_id)
    probes = sum(1 for r in records if r["feedback"]["details"].get("charged", True))
    gains = {r["key"]: r["feedback"]["numbers"].get("objective_ratio") for r in records if r["key"].endswith("/e2e")}
    unearned = [t for t in accepted if not ((gains.get(f"trial/{t['trial']}/e2e") or {}).get("ci_low") or 0) > 1]
    return {"probes": probes, "diagnosis_s": diagnosed, "probes_to_diagnosis": named[0] if named else None,
            "fix_s": fix_at, "wrong_acceptances": len(wrong), "unearned_acceptances": len(unearned),
            "trials": len(outcome.trials), "wall_s": round(seconds, 1), "limits": outcome.limits,
            "why": [t["why"][:160] for t in outcome.trials],
            "tried": [{"trial": t["trial"], "knobs": t["knobs"], "accepted": t in accepted,
                       "gain": gains.get(f"trial/{t['trial']}/e2e"), "at_s": events.get(f"trial/{t['trial']} accepted")}
                      for t in outcome.trials]}


def run_planted(model: str, mode: str, home: Path) -> dict:
    """The scripted five-proposal sequence under one feedback mode."""
    folder = home / f"planted-{mode}"
    folder.mkdir(parents=True)
    planted_checkout(folder / "checkout")
    (folder / "spec.toml").write_text(planted_spec(model))
    script = proposer_script(folder / "propose.py", SEQUENCE)
    ledger = Ledger(folder / "ledger.sqlite")
    started = time.monotonic()
    outcome = optimize(folder / "spec.toml", ledger, Budget(probes=40, minutes=60),
                       CommandProposer([sys.executable, str(script)]), log=print, feedback=mode)
    return figures(outcome, ledger, time.monotonic() - started, CAUSES["planted"], SEQUENCE)


def run_pack(name: str, mode: str, home: Path, probes: int, minutes: float, proposer: str) -> dict:
    """A pack under the search (or playbook) proposer and one feedback mode."""
    folder = home / f"{name}-{mode}"
    shutil.copytree(PACKS / name, folder, ignore=shutil.ignore_patterns("__pycache__"))
    ledger = Ledger(folder / "ledger.sqlite")
    chosen = PlaybookProposer(load_spec(folder / "spec.toml").playbook) if proposer == "playbook" else None
    started = time.monotonic()
    outcome = optimize(folder / "spec.toml", ledger, Budget(probes=probes, minutes=minutes), chosen, log=print,
                       feedback=mode)
    return figures(outcome, ledger, time.monotonic() - started, CAUSES.get(name), fixes=FIXES.get(name))


def line(case: str, mode: str, r: dict) -> str:
    def s(x: float | None) -> str:
        return "-" if x is None else f"{x:.0f}"

    return (f"{case:20s} {mode:9s} probes {r['probes']:3d}  diagnosis {s(r['diagnosis_s']):>5s} s "
            f"({r['probes_to_diagnosis'] or '-'} probes)  fix {s(r['fix_s']):>5s} s  wrong {r['wrong_acceptances']}  "
            f"no-gain {r['unearned_acceptances']}  "
            f"trials {r['trials']}  wall {r['wall_s']:.0f} s")


def main() -> None:
    """Run the cases and print them side by side (and the ratio of time to the fix)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama", choices=["llama", "hybrid"])
    parser.add_argument("--packs", nargs="*", default=[])
    parser.add_argument("--pack-probes", type=int, default=16)
    parser.add_argument("--pack-minutes", type=float, default=6.0)
    parser.add_argument("--skip-planted", action="store_true")
    parser.add_argument("--proposer", default="search", choices=["search", "playbook"], help="for the packs")
    parser.add_argument("--modes", nargs="*", default=["ladder", "e2e-only"])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="ablation-"))
    results: dict[str, dict[str, list[dict]]] = {}
    cases = ([] if args.skip_planted else ["planted"]) + args.packs
    for case in cases:
        results[case] = {mode: [] for mode in args.modes}
        for repeat in range(args.repeats):
            for mode in (args.modes if repeat % 2 == 0 else list(reversed(args.modes))):
                place = home / f"repeat-{repeat}"
                place.mkdir(exist_ok=True)
                results[case][mode].append(run_planted(args.model, mode, place) if case == "planted" else
                                           run_pack(case, mode, place, args.pack_probes, args.pack_minutes,
                                                    args.proposer))
    print()
    for case, modes in results.items():
        for mode, runs in modes.items():
            for r in runs:
                print(line(case, mode, r))
        if {"ladder", "e2e-only"} <= modes.keys():
            pairs = [(a["fix_s"], b["fix_s"]) for a, b in zip(modes["ladder"], modes["e2e-only"])]
            if pairs and all(None not in pair for pair in pairs):
                each = ", ".join(f"{a / b:.3f}" for a, b in pairs)
                medians = statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)
                spread = block_estimate([math.log(a / b) for a, b in pairs], 0.95) if len(pairs) > 1 else None
                ci = (f"; geometric mean {spread.ratio:.3f} [{spread.lo:.3f}, {spread.hi:.3f}], 95% t interval over "
                      f"{spread.blocks} repeats" if spread else "")
                print(f"{case:20s} ladder/e2e-only time to the accepted fix: {medians:.3f} (ratio of medians; "
                      f"per repeat {each}{ci})")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
