"""What a step-bench unit costs and how much it spreads: an A/A of two engine children of the same code
(the planted checkout of tests/engine_checkout.py), alternating rounds per unit shape, and the first units
of fresh children (the warm-up a shape needs).

    PYTHONPATH=src .venv/bin/python benchmarks/step_unit_spread.py [--rounds 10] [--passes 3] [--fresh 4]

Prints, per shape, the spread per round (sd of the log ratio of the two children) of each pass and the
seconds per round; then each fresh child's first five unit times (ms). Run alone: two cores, and this
times things.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the planted checkout is shared with the tests

from engine_checkout import planted_checkout  # noqa: E402
from infragent.engine.config import EngineConfig  # noqa: E402
from infragent.probes.step_bench import StepWorker, Unit, step_rounds  # noqa: E402

CONFIG = json.loads(EngineConfig(model="llama", max_model_len=1024, max_num_seqs=4).to_json())


def shapes() -> dict[str, Unit]:
    """The unit shapes compared: prompts of 64 or 32 tokens, 8, 6 or 4 output tokens."""
    rng = random.Random(11)
    first = [1] + [rng.randrange(100, 40000) for _ in range(63)]
    second = [1] + [rng.randrange(100, 40000) for _ in range(40)]
    return {"2 x 64 x 8": Unit([first, second], 8), "2 x 32 x 4": Unit([first[:32], second[:32]], 4),
            "2 x 32 x 6": Unit([first[:32], second[:32]], 6)}


def main() -> None:
    """Spread and cost per shape, then fresh children's first units."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--fresh", type=int, default=4)
    args = parser.parse_args()
    code = planted_checkout(Path(tempfile.mkdtemp(prefix="step-unit-")) / "checkout")
    units = shapes()
    a, b = StepWorker(code, CONFIG, "a"), StepWorker(code, CONFIG, "b")
    a.ready(), b.ready()
    spread: dict[str, list[tuple[float, float]]] = {name: [] for name in units}
    for _ in range(args.passes):
        for name, unit in units.items():
            started = time.monotonic()
            logs = step_rounds(a, b, unit, args.rounds)
            spread[name].append((statistics.stdev(logs["total"]), (time.monotonic() - started) / args.rounds))
    a.close(), b.close()
    for name, passes in spread.items():
        print(f"{name}: spread per round {', '.join(f'{sd:.3f}' for sd, _ in passes)}; "
              f"{statistics.mean(s for _, s in passes):.2f} s a round")
    unit = units["2 x 32 x 4"]
    for n in range(args.fresh):
        child = StepWorker(code, CONFIG, "fresh").ready()
        times = []
        for _ in range(5):
            ran = child.run(unit)
            times.append(round((ran["prefill_ns"] + ran["decode_ns"]) / 1e6))
        child.close()
        print(f"fresh child {n + 1}: first five units {times} ms")


if __name__ == "__main__":
    main()
