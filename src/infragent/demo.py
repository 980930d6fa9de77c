"""`make demo`: the main job. The agent tunes the built-in engine (SmolLM2-135M) for the engine-slo pack's
TTFT/TPOT SLO with the search proposer, within a budget that fits the demo's 10 minutes on 2 cores, and
ends with baseline against best per criterion, what limited the result, and the HTML report."""
from __future__ import annotations

import os
from pathlib import Path

from infragent.agent.context import Budget
from infragent.agent.run_optimize import run_optimize
from infragent.lab.spec import resolve_spec


def main() -> None:
    """Run `infragent optimize` on the engine-slo pack."""
    minutes = float(os.environ.get("INFRAGENT_DEMO_MINUTES", "4"))  # no trial starts after this
    print(f"infragent demo: optimize the engine-slo pack (search proposer, budget {minutes:g} minutes)\n")
    run_optimize(resolve_spec(None), Path(".infragent/ledger.sqlite").resolve(), Budget(probes=16, minutes=minutes))


if __name__ == "__main__":
    main()
