"""The end-to-end gate's throughput criterion replayed on stored ledgers: per run, the output_tok_s ratio of the
fix's trial over its twin repeats (as the gate judged it before bf486a1) and over the same requests' twin blocks
(as it judges it now), with each one's 95% interval and spread. planted_fix_loop.py leaves one ledger per run
under /tmp/planted-fix-*/run-N/ledger.sqlite.

    PYTHONPATH=src .venv/bin/python benchmarks/twin_blocks_replay.py /tmp/planted-fix-XXXX/run-*/ledger.sqlite
"""
from __future__ import annotations

import argparse
import json
import math

import numpy as np

from infragent.analysis.blocks import block_estimate
from infragent.analysis.serving_metrics import RequestRecord
from infragent.lab.criteria import REPEAT_TRIM, Run, run_value, twin_block_ratios
from infragent.lab.ledger import Ledger


def sides(ledger: Ledger, trial: str = "trial/0", scenario: str = "chat") -> dict[str, list[Run]] | None:
    """The e2e runs of one trial, per side, from the ledger's stored records (None when it has none)."""
    results = {r["key"]: r for r in ledger.probe_results(1)}
    out = {}
    for side in ("baseline", "candidate"):
        result = results.get(f"{trial}/{scenario}/{side}")
        if result is None:
            return None
        data = json.loads(ledger.artifact_path(result["feedback"]["evidence"][0]["sha256"]).read_text())
        out[side] = [Run([RequestRecord(**r) for r in run["records"]], run["duration_s"],
                         block=run.get("block") or 4) for run in data["runs"]]
    return out


def main() -> None:
    """One line per ledger: both intervals of the time per output token, candidate/baseline."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("ledgers", nargs="+")
    parser.add_argument("--block", type=int, default=4, help="requests per interleaved block (the scenario's concurrency)")
    args = parser.parse_args()
    for path in args.ledgers:
        runs = sides(Ledger(path))
        if runs is None:
            print(f"{path}: no e2e runs")
            continue
        for run in runs["baseline"] + runs["candidate"]:
            run.block = args.block
        repeats = [math.log(run_value(b, "output_tok_s", b.records) / run_value(c, "output_tok_s", c.records))
                   for b, c in zip(runs["baseline"], runs["candidate"])]
        blocks = twin_block_ratios(runs["baseline"], runs["candidate"])
        by_repeat = block_estimate(repeats, 0.95, trim=REPEAT_TRIM)
        line = (f"{path}: twin repeats x{by_repeat.ratio:.3f} [{by_repeat.lo:.3f}, {by_repeat.hi:.3f}] "
                f"(n={len(repeats)}, sd {np.std(repeats, ddof=1):.3f})")
        if blocks:
            by_block = block_estimate(blocks, 0.95, trim=REPEAT_TRIM)
            line += (f" | twin blocks x{by_block.ratio:.3f} [{by_block.lo:.3f}, {by_block.hi:.3f}] "
                     f"(n={len(blocks)}, sd {np.std(blocks, ddof=1):.3f})")
        else:
            line += " | twin blocks: none (a failed request, or runs not sent block by block)"
        print(line)


if __name__ == "__main__":
    main()
