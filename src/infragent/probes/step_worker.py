"""The child side of the step microbenchmark: one engine, built from whichever infragent is first on this
process's PYTHONPATH (a candidate's worktree or the baseline's), running units of work on command.

    python -m infragent.probes.step_worker   (JSON lines on stdin, one JSON line per answer on stdout)

First line in: {"config": {EngineConfig fields, "hybrid": {...}}}; answer {"ready": true, "code": FOLDER}.
Then per line in: {"prompts": [[token ids], ...], "max_tokens": N} (and "trace": PATH to run it under the
tracer); the batch runs to completion, greedy, and the answer is {"prefill_ns", "decode_ns",
"prefill_wait_ns", "decode_wait_ns", "decode_steps", "steps", "tokens"} (and "trace") — steps that ran while some
request had no token yet count as prefill, the rest as decode; a phase's wait is the part of its wall time
the engine's thread spent runnable but off the CPU (another process had it). With "lockstep": true the
requests are added and each engine step waits for a line {"step": true}: the answer to each is {"done": false},
and to the last one the unit's answer with "done": true. The parent steps two children in turn, so the machine's
moods (a host's clock and its neighbours change within a second) fall on both sides' steps alike.

gil_workload is the same engine and unit as a workload for the gil probe (a proposer's `gil` tool).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main() -> None:
    """Serve units until stdin closes."""
    import infragent
    from infragent.engine.sampling import SamplingParams

    engine = build_engine(json.loads(sys.stdin.readline())["config"])
    _say({"ready": True, "code": str(Path(infragent.__file__).resolve().parent)})
    for line in sys.stdin:
        unit = json.loads(line)
        if unit.get("trace"):  # the unit under the tracer, saved where asked
            from infragent.trace import Recorder

            with Recorder(thread_cpu=True) as rec:
                answer = _run(engine, unit, SamplingParams)
            _say({**answer, "trace": str(rec.trace().save(unit["trace"]))})
            continue
        if unit.get("lockstep"):
            _say({**_run(engine, unit, SamplingParams, before_step=_await_turn), "done": True})
            continue
        _say(_run(engine, unit, SamplingParams))


def _await_turn(steps: int) -> None:
    """In lockstep: acknowledge the step before (none before the first), then wait for the parent's turn."""
    if steps:
        _say({"done": False})
    line = sys.stdin.readline()
    if not line:
        raise SystemExit("the parent closed stdin in the middle of a lockstep unit")


def build_engine(fields: dict):  # noqa: ANN201 (the LLMEngine of whichever copy of the code runs this)
    """An engine from EngineConfig fields as plain data (its "hybrid" as a dict)."""
    from infragent.engine.config import EngineConfig, HybridConfig
    from infragent.engine.llm_engine import LLMEngine

    fields = dict(fields)
    hybrid = HybridConfig(**fields.pop("hybrid", {}))
    return LLMEngine(EngineConfig(**fields, hybrid=hybrid))


def gil_workload() -> None:
    """A workload for the gil probe (infragent.probes.step_worker:gil_workload): the engine of
    $INFRAGENT_STEP_UNIT's config runs its unit ({"config", "prompts", "max_tokens", "units"}) that many times,
    after one unit of warm-up."""
    import os

    from infragent.engine.sampling import SamplingParams

    unit = json.loads(os.environ["INFRAGENT_STEP_UNIT"])
    engine = build_engine(unit["config"])
    try:
        for _ in range(1 + int(unit.get("units", 3))):
            _run(engine, unit, SamplingParams)
    finally:
        engine.close()


def _run(engine, unit: dict, sampling, before_step=None) -> dict:  # noqa: ANN001 (this copy's engine and types)
    """One unit to completion: prefill and decode time, decode steps, and every request's tokens;
    before_step(steps taken so far), when given, runs untimed before each step."""
    params = sampling(max_tokens=unit["max_tokens"], temperature=0.0, ignore_eos=True)
    seqs = [engine.add_request(ids, params) for ids in unit["prompts"]]
    spent = {"prefill_ns": 0, "decode_ns": 0, "prefill_wait_ns": 0, "decode_wait_ns": 0}
    steps = taken = 0
    while engine.has_unfinished():
        if before_step is not None:
            before_step(taken)
        taken += 1
        phase = "decode" if all(s.output_token_ids for s in seqs) else "prefill"
        waited, started = run_queue_wait_ns(), time.perf_counter_ns()
        engine.step()
        spent[f"{phase}_ns"] += time.perf_counter_ns() - started
        spent[f"{phase}_wait_ns"] += run_queue_wait_ns() - waited
        steps += phase == "decode"
    return {**spent, "decode_steps": steps, "steps": taken, "tokens": [list(s.output_token_ids) for s in seqs]}


def run_queue_wait_ns() -> int:
    """ns this thread has spent runnable but waiting for a CPU (schedstat's second field; 0 where the kernel
    keeps none): the part of a step's wall time that another process, not the step, decided."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
