"""Where the step bench's A/A bias comes from: several children of the same code, run in a random order each
round, so that a child's own offset (its layout, its start) can be told from round-to-round noise.

    PYTHONPATH=src .venv/bin/python benchmarks/step_aa_bias.py [--children 4] [--rounds 12] [--sessions 3]

Per session: each child's mean log time relative to the session's mean (its offset), the offsets' spread,
and the spread the round-to-round noise alone would give them (sd / sqrt(rounds)); then the same offsets
from the first and second half of the rounds (a child's own offset persists; noise does not), and the mean
log time by position in the round (order effects). Raw unit times go to --out. Run alone: it times things.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from engine_checkout import planted_checkout  # noqa: E402
from infragent.engine.config import EngineConfig  # noqa: E402
from infragent.probes.step_bench import StepWorker, Unit, own_ns  # noqa: E402
from step_unit_spread import CONFIG, shapes  # noqa: E402


def session(code: Path, children: int, rounds: int, unit: Unit, rng: random.Random) -> dict:
    """One session's raw log unit times per child and position."""
    workers = [StepWorker(code, CONFIG, f"c{i}") for i in range(children)]
    for w in workers:
        w.ready()
    for w in workers:
        w.warm(unit)
    times: dict[str, list[float]] = {w.name: [] for w in workers}
    by_position: list[list[float]] = [[] for _ in workers]
    for _ in range(rounds):
        order = rng.sample(workers, len(workers))
        ran = [(w, w.run(unit)) for w in order]
        mean = statistics.mean(math.log(own_ns(a, "prefill") + own_ns(a, "decode")) for _, a in ran)
        for position, (w, a) in enumerate(ran):
            centred = math.log(own_ns(a, "prefill") + own_ns(a, "decode")) - mean
            times[w.name].append(centred)
            by_position[position].append(centred)
    for w in workers:
        w.close()
    return {"times": times, "by_position": by_position}


def offsets(times: dict[str, list[float]]) -> dict[str, float]:
    """Each child's mean centred log time."""
    return {name: statistics.mean(v) for name, v in times.items()}


def main() -> None:
    """Sessions of several same-code children; offsets, their persistence, and order effects."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--shape", default="2 x 32 x 4")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "step_aa_bias.json")
    args = parser.parse_args()
    code = planted_checkout(Path(tempfile.mkdtemp(prefix="step-aa-")) / "checkout")
    unit, rng = shapes()[args.shape], random.Random(7)
    raw = []
    for s in range(args.sessions):
        started = time.monotonic()
        got = session(code, args.children, args.rounds, unit, rng)
        raw.append(got)
        own = offsets(got["times"])
        noise = statistics.mean(statistics.stdev(v) for v in got["times"].values())
        half = args.rounds // 2
        first = offsets({n: v[:half] for n, v in got["times"].items()})
        second = offsets({n: v[half:] for n, v in got["times"].items()})
        print(f"session {s + 1} ({time.monotonic() - started:.0f} s): offsets "
              + ", ".join(f"{n} {100 * o:+.1f}%" for n, o in own.items())
              + f"; spread {100 * statistics.stdev(own.values()):.1f}% vs noise alone "
              f"{100 * noise / math.sqrt(args.rounds):.1f}% (round sd {100 * noise:.1f}%)")
        print("   halves: " + ", ".join(f"{n} {100 * first[n]:+.1f}/{100 * second[n]:+.1f}" for n in own)
              + "; by position: " + ", ".join(f"{100 * statistics.mean(p):+.1f}%" for p in got["by_position"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "sessions": raw}))
    print(f"raw: {args.out}")


if __name__ == "__main__":
    main()
