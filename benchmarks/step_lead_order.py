"""Whether the step bench's A/A bias comes from order: blocks of the baseline's code against itself, each with one
of four orders in rotation (which side is forked first, which side warms first and leads the rounds), so each
order's mean log ratio (twin/baseline) is read in one interleaved run, beside the others.

    PYTHONPATH=src .venv/bin/python benchmarks/step_lead_order.py [--blocks-each 24] [--shape "2 x 32 x 4"]

With the baseline always leading, 44 in-loop A/As (4 blocks each) read x1.014 [1.002, 1.027] on blocks that
forked the baseline first and x1.008 [0.993, 1.023] on those that forked the twin first (99%): the twin slower
either way. Prints each order's mean ratio with its 99% interval, and the two contrasts (lead, fork) pooled over
the other; raw block ratios go to --out. Run alone: it times things.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from infragent.probes.step_bench import StepWorker, _block  # noqa: E402
from step_bench_power import copy_of  # noqa: E402
from step_unit_spread import CONFIG, shapes  # noqa: E402

ORDERS = [(False, False), (True, True), (True, False), (False, True)]  # (twin forked first, twin leads)
Z99 = 2.576


def interval(logs: list[float]) -> str:
    """Mean ratio and its 99% normal interval, from log ratios."""
    m = statistics.mean(logs)
    half = Z99 * statistics.stdev(logs) / math.sqrt(len(logs))
    return f"x{math.exp(m):.4f} [{math.exp(m - half):.4f}, {math.exp(m + half):.4f}] n={len(logs)}"


def main() -> None:
    """The four orders in rotation, then each order's ratio and the two contrasts."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks-each", type=int, default=24)
    parser.add_argument("--shape", default="2 x 32 x 4")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "step_lead_order.json")
    args = parser.parse_args()
    code = copy_of(Path(tempfile.mkdtemp(prefix="step-lead-")) / "plain")
    unit = shapes()[args.shape]
    base, twin = StepWorker(code, CONFIG, "baseline"), StepWorker(code, CONFIG, "twin")
    by_order: dict[tuple[bool, bool], list[float]] = {o: [] for o in ORDERS}
    started = time.monotonic()
    for i in range(args.blocks_each * len(ORDERS)):
        twin_first, twin_leads = ORDERS[i % len(ORDERS)]
        if twin_first:
            t = twin.sibling()
            pair = (base.sibling(), t)
        else:
            pair = (base.sibling(), twin.sibling())
        try:
            block = _block(pair[0].ready(), pair[1].ready(), unit, candidate_first=twin_leads)
        finally:
            for w in pair:
                w.close()
        by_order[(twin_first, twin_leads)].append(statistics.mean(block["total"]))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                        "orders": {f"twin_forked_first={f} twin_leads={lead}": v
                                                   for (f, lead), v in by_order.items()}}, indent=1))
    print(f"{args.blocks_each * len(ORDERS)} blocks in {time.monotonic() - started:.0f} s")
    for (f, lead), logs in by_order.items():
        print(f"twin forked first={f!s:5} twin leads={lead!s:5}: {interval(logs)}")
    lead = [x for (f, ld), v in by_order.items() if ld for x in v]
    follow = [x for (f, ld), v in by_order.items() if not ld for x in v]
    first = [x for (f, ld), v in by_order.items() if f for x in v]
    second = [x for (f, ld), v in by_order.items() if not f for x in v]
    print(f"twin leads: {interval(lead)}; baseline leads: {interval(follow)}")
    print(f"twin forked first: {interval(first)}; baseline forked first: {interval(second)}")
    print(f"all (what alternating both gives): {interval(lead + follow)}")
    print(f"raw: {args.out}")


if __name__ == "__main__":
    main()
