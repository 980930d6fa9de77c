"""`infragent serve` with a planted prefill slowdown, for testing the criteria engine on real runs.

    python benchmarks/planted_server.py --prefill-slowdown 0.08 serve --model llama --port 8001

Every engine step that computes prefill tokens spins for the given fraction of its own time afterwards,
so prefill gets exactly that much slower while decode-only steps are untouched.
"""
from __future__ import annotations

import sys
import time

from infragent.engine.runner import ModelRunner


def plant(fraction: float) -> None:
    """Patch ModelRunner.run to spend `fraction` more time on steps with prefill work."""
    original = ModelRunner.run

    def run(self: ModelRunner, batch):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        out = original(self, batch)
        if any(n > 1 for n in batch.num_new_tokens):
            end = time.perf_counter() + (time.perf_counter() - start) * fraction
            while time.perf_counter() < end:
                pass
        return out
    ModelRunner.run = run


if __name__ == "__main__":
    args = sys.argv[1:]
    fraction = float(args[args.index("--prefill-slowdown") + 1])
    del args[args.index("--prefill-slowdown"):args.index("--prefill-slowdown") + 2]
    plant(fraction)
    from infragent.cli import app

    sys.argv = ["infragent", *args]
    app()
