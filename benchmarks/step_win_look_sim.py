"""What reading a step win only from MIN_WIN_BLOCKS blocks costs and buys, replayed on real blocks: each
simulated bench draws its blocks (with replacement) from one real 32-block A/A run of the step bench
(results/step_bench_power-yuen.json: 20 runs, a spread of 4-9% per block), shifted by a planted effect, and
looks at them as step_bench does (probes/step_bench.step_look: even counts from MIN_ROUNDS, the 3% floor,
at most MAX_ROUNDS blocks, or each of --max-rounds) with wins read from 4, 6 or 8 blocks on (--leasts).

    PYTHONPATH=src .venv/bin/python benchmarks/step_win_look_sim.py [--sims 1000] [--json OUT]
        [--max-rounds 32 48] [--leasts 8]

Prints, per effect, cap and least block count, the share of benches that show a win and the mean blocks run.
iid draws: they price the rule in power, not the transient it guards against (a few seconds that favour one
side; see step_bench's docstring), which no resampling of independent blocks reproduces.
"""
from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

from infragent.probes.step_bench import MAX_ROUNDS, MIN_ROUNDS, STEP_MIN_FLOOR, step_look

RESULTS = Path(__file__).resolve().parent / "results"
EFFECTS = (0.0, -0.03, -0.05, -0.075, -0.10)  # log ratio candidate/baseline planted on the A/A blocks
LEASTS = (4, 6, 8)


def aa_runs(path: Path = RESULTS / "step_bench_power-yuen.json") -> list[list[float]]:
    """The real A/A runs' per-block total log ratios."""
    return [row["log_ratios"] for row in json.loads(path.read_text())["rows"] if row["kind"] == "aa"]


def bench(pool: list[float], effect: float, least: int, rng: random.Random, rounds: int = MAX_ROUNDS
          ) -> tuple[bool, int]:
    """One simulated step bench of at most `rounds` blocks: (a win shown, blocks run)."""
    total: list[float] = []
    while len(total) < rounds:
        total.append(rng.choice(pool) + effect)
        if len(total) >= MIN_ROUNDS and len(total) % 2 == 0:
            look = step_look(total, STEP_MIN_FLOOR, rounds, least)
            if look != "go on":
                return look == "win", len(total)
    return step_look(total, STEP_MIN_FLOOR, rounds, least) == "win", len(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--max-rounds", type=int, nargs="+", default=[MAX_ROUNDS])
    parser.add_argument("--leasts", type=int, nargs="+", default=list(LEASTS))
    args = parser.parse_args()
    runs = aa_runs()
    rows = []
    for effect in EFFECTS:
        for rounds in args.max_rounds:
            for least in args.leasts:
                rng = random.Random(1)  # the same draws for each cap and least: paired comparison
                outcomes = [bench(runs[i % len(runs)], effect, least, rng, rounds) for i in range(args.sims)]
                wins = sum(won for won, _ in outcomes)
                rows.append({"effect": effect, "max_rounds": rounds, "least": least, "sims": args.sims,
                             "wins": wins, "mean_blocks": sum(n for _, n in outcomes) / args.sims})
                print(f"effect x{math.exp(effect):.3f}  at most {rounds} blocks, wins read from {least} blocks: "
                      f"shown {wins}/{args.sims} ({wins / args.sims:.1%}), mean blocks "
                      f"{rows[-1]['mean_blocks']:.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
