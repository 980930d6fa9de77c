"""`infragent serve` with a planted slowdown, for testing verdicts on real runs.

    python benchmarks/planted_server.py --prefill-slowdown 0.08 serve --model llama --port 8001
    python benchmarks/planted_server.py --decode-slowdown 0.25 serve --model llama --port 8001

--prefill-slowdown: every engine step that computes prefill tokens spins for the given fraction of its own
time afterwards, so prefill gets exactly that much slower while decode-only steps are untouched.
--decode-slowdown: every decode-only step sleeps for the given fraction of its own time afterwards.
"""
from __future__ import annotations

import sys
import time

from infragent.engine.runner import ModelRunner


def plant(fraction: float, phase: str = "prefill") -> None:
    """Patch ModelRunner.run to spend `fraction` more time on steps of one phase (prefill spins, decode sleeps)."""
    original = ModelRunner.run

    def run(self: ModelRunner, batch):  # noqa: ANN001, ANN202
        start = time.perf_counter()
        out = original(self, batch)
        prefill = any(n > 1 for n in batch.num_new_tokens)
        took = time.perf_counter() - start
        if phase == "prefill" and prefill:
            end = time.perf_counter() + took * fraction
            while time.perf_counter() < end:
                pass
        elif phase == "decode" and not prefill:
            time.sleep(took * fraction)
        return out
    ModelRunner.run = run


def _take(args: list[str], flag: str) -> float | None:
    if flag not in args:
        return None
    i = args.index(flag)
    value = float(args[i + 1])
    del args[i:i + 2]
    return value


if __name__ == "__main__":
    args = sys.argv[1:]
    for flag, phase in (("--prefill-slowdown", "prefill"), ("--decode-slowdown", "decode")):
        fraction = _take(args, flag)
        if fraction is not None:
            plant(fraction, phase)
    from infragent.cli import app

    sys.argv = ["infragent", *args]
    app()
