"""Whether stepping a pair in lockstep tightens the step bench's blocks: fresh A/A pairs of the same code, the
ways of running a block's rounds interleaved block by block (the order of the ways reversed every other block).

    PYTHONPATH=src .venv/bin/python benchmarks/step_lockstep.py [--blocks 16] [--rounds 4] [--ways whole,lockstep,pinned]

- whole: each child runs its unit whole, one after the other (the bench before lockstep).
- lockstep: the two children take one engine step each in turn (probes/step_bench.lockstep).
- pinned: lockstep, and each child's main thread on the first CPU, its other threads on the last.
Per way: the spread of the block means (what the bench's interval is made of), the spread of rounds within a
block, and the pair offset that the two leave (block variance less round variance / rounds). Raw per-round log
ratios to --out. Run alone: it times things.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from infragent.probes.step_bench import StepWorker, Unit, lockstep, own_ns  # noqa: E402
from step_unit_spread import CONFIG, shapes  # noqa: E402


def pin(worker: StepWorker) -> None:
    """The child's main thread on the first CPU of ours, its other threads (the OpenMP pool) on the last."""
    cpus = sorted(os.sched_getaffinity(0))
    for tid in map(int, os.listdir(f"/proc/{worker.proc.pid}/task")):
        os.sched_setaffinity(tid, {cpus[0]} if tid == worker.proc.pid else {cpus[-1]})


def block(way: str, unit: Unit, rounds: int, y_first: bool) -> list[float]:
    """One fresh pair x, y of the same code: log(y/x) of each round's own time."""
    pair = [StepWorker(None, CONFIG, name) for name in (("y", "x") if y_first else ("x", "y"))]
    x, y = sorted(pair, key=lambda w: w.name)
    try:
        for w in pair:
            w.ready()
        for w in pair:
            w.warm(unit)
        if way == "pinned":
            for w in pair:
                pin(w)
                w.run(unit)  # a unit on its new CPUs before any counts
        logs = []
        for r in range(rounds):
            first, second = (x, y) if r % 2 == 0 else (y, x)
            ran = (dict(zip((id(first), id(second)), lockstep(first, second, unit))) if way != "whole"
                   else {id(first): first.run(unit), id(second): second.run(unit)})
            own = {w.name: own_ns(ran[id(w)], "prefill") + own_ns(ran[id(w)], "decode") for w in (x, y)}
            logs.append(math.log(own["y"] / own["x"]))
        return logs
    finally:
        for w in pair:
            w.close()


def summary(blocks: list[list[float]]) -> dict[str, float]:
    """Spread of block means, of rounds within blocks, and the pair offset left."""
    means = [statistics.mean(b) for b in blocks]
    within = statistics.mean(statistics.variance(b) for b in blocks)
    rounds = len(blocks[0])
    return {"blocks": len(blocks), "block_sd": statistics.stdev(means), "round_sd": math.sqrt(within),
            "offset_sd": math.sqrt(max(statistics.variance(means) - within / rounds, 0.0)),
            "mean_ratio": math.exp(statistics.mean(means))}


def main() -> None:
    """Blocks of each way, interleaved; a summary line per way."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--blocks", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--ways", default="whole,lockstep,pinned")
    parser.add_argument("--shape", default="2 x 32 x 4")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "step_lockstep.json")
    args = parser.parse_args()
    ways, unit = args.ways.split(","), shapes()[args.shape]
    raw: dict[str, list[list[float]]] = {w: [] for w in ways}
    for b in range(args.blocks):
        for way in ways if b % 2 == 0 else ways[::-1]:
            raw[way].append(block(way, unit, args.rounds, y_first=b % 2 == 1))
            print(f"block {b} {way}: " + " ".join(f"{v:+.3f}" for v in raw[way][-1]), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "raw": raw}))
    for way, blocks in raw.items():
        s = summary(blocks)
        print(f"{way}: {s['blocks']} blocks; block-mean sd {s['block_sd']:.4f}; round sd {s['round_sd']:.4f}; "
              f"pair offset sd ~{s['offset_sd']:.4f}; mean y/x x{s['mean_ratio']:.4f}")
    print(f"raw: {args.out}")


if __name__ == "__main__":
    main()
