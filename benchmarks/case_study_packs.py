"""The three case-study packs under the loop: how many probe runs until a hypothesis names the true cause,
what it says (with the ledger paths of the numbers it cites), and what the search found within a budget.

    PYTHONPATH=src .venv/bin/python benchmarks/case_study_packs.py [--packs tp-precision ...] [--probes 16]

Each pack is copied to a temporary folder first (the loop never touches the installed pack).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

from infragent.agent.context import Budget
from infragent.agent.core import optimize
from infragent.lab.trajectory import probes_until
from infragent.lab.ledger import Ledger
from infragent.lab.spec import PACKS

CAUSES = {  # what naming the true cause means, per the issue: words the hypothesis must contain
    "tp-precision": ["shards", "column:2", "bf16 operands"],
    "kda-decode-padding": ["the FP32 work in", "kda.qk_norm", "kda.gate", "redone in every kda.v_tile"],
    "kv-transfer-gil": ["kv-transfer", "starved of the GIL", "never overlap"],
}


def run_pack(name: str, probes: int, minutes: float) -> dict:
    """Optimize a copy of the pack; the probe runs up to the one that settled the cause, the hypotheses, the best trial."""
    home = Path(tempfile.mkdtemp(prefix=f"pack-{name}-"))
    shutil.copytree(PACKS / name, home / name, ignore=shutil.ignore_patterns("__pycache__"))
    ledger = Ledger(home / "ledger.sqlite")
    started = time.monotonic()
    outcome = optimize(home / name / "spec.toml", ledger, Budget(probes=probes, minutes=minutes),
                       log=lambda line: None)
    found = probes_until(ledger, outcome.run_id, CAUSES[name])
    used, named = (found[0], found[1]["claim"]) if found else (None, None)
    best = outcome.best
    return {"pack": name, "probes_to_cause": used, "cause": named,
            "cites": next((h.cites for h in outcome.hypotheses if h.claim == named), {}),
            "trials": [{k: t.get(k) for k in ("knobs", "status", "objective", "feasible", "why")} for t in outcome.trials],
            "best": None if best is None else {"knobs": best["knobs"], "objective": best["objective"],
                                               "judgements": [j["message"] for j in best.get("judgements", [])]},
            "limits": outcome.limits, "seconds": round(time.monotonic() - started, 1), "ledger": str(ledger.path)}


def main() -> None:
    """Run each pack and print the result lines."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--packs", nargs="*", default=list(CAUSES))
    parser.add_argument("--probes", type=int, default=16)
    parser.add_argument("--minutes", type=float, default=8.0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    results = []
    for name in args.packs:
        r = run_pack(name, args.probes, args.minutes)
        results.append(r)
        print(f"{name}: cause named after {r['probes_to_cause']} probe runs ({r['seconds']:.0f} s in all)")
        print(f"  {r['cause']}")
        for cite, value in r["cites"].items():
            print(f"    cites {cite} = {value:.4g}")
        for t in r["trials"]:
            print(f"  trial {t['knobs']}: {t['status']}, speedup {t['objective'] or float('nan'):.3g}x, {t['why'][:160]}")
        print(f"  best: {r['best']}; limits: {r['limits']}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
