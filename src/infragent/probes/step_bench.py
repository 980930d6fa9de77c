"""The step microbenchmark: the engine's prefill and decode steps timed in-process, baseline against
candidate, each engine built from its own copy of the code (a worktree's src/) in its own child
(probes/step_worker.py). The children take turns, one unit at a time in alternating order, so drift on the
machine falls on both; the verdict comes from the per-round log ratios (candidate/baseline), judged over
rounds with a t interval against an A/A floor, like the local A/B's blocks. Seconds, not minutes: a patch
that makes the engine slower or changes its greedy tokens is refuted before any server starts.

A step win is strict, because a patch with one goes on to an end-to-end run that only guards against
regressions: the candidate's whole 99% interval must lie beyond the floor, and the floor clears the A/A
interval's outer bound and at least STEP_MIN_FLOOR (two children of the same code differ by a few percent —
memory layout — and a candidate's child has its own such bias, which one A/A pair cannot predict). The
rounds stop early, from MIN_ROUNDS on, once the verdict is known: a win, or no win possible.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infragent.analysis.blocks import BlockEstimate, block_estimate, could_still_win
from infragent.probes.feedback import Feedback, Measure

CHECK_PROMPTS_IDS = ([1, 504, 3458, 282, 4649, 314], [1, 563, 14881, 26, 6, 1435, 339, 42], [1, 22862, 1768, 288])
CONFIDENCE = 0.99  # per look, from MIN_ROUNDS to MAX_ROUNDS
MIN_ROUNDS = 4
MAX_ROUNDS = 12
STEP_MIN_FLOOR = 0.05  # A/A pairs of children differed by up to 4.6% on one machine (docs/BENCHMARKS.md)
WARMUP_UNITS = 2  # units of a shape a child runs before its timings count
ANSWER_TIMEOUT_S = 300.0  # a worker that answers nothing this long (engine build or one unit) is killed


class StepBenchError(RuntimeError):
    """A step worker could not start or died; the message carries its stderr tail."""


@dataclass
class Unit:
    """One batch of work: prompts (token ids) run to max_tokens greedy tokens each."""

    prompts: list[list[int]]
    max_tokens: int

    @property
    def shape(self) -> str:
        """Prompt lengths and output length: what a child's warm-up is per."""
        return f"{[len(p) for p in self.prompts]}x{self.max_tokens}"


class StepWorker:
    """One child engine built from `code` (a checkout of this project; None: the installed package)."""

    def __init__(self, code: Path | None, config: dict[str, Any], name: str) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONHASHSEED": "0",  # same hashing in every child
               "OMP_WAIT_POLICY": "PASSIVE"}  # an idle child's threads must not spin on the cores the other times
        if code is not None:
            source = code / "src" if (code / "src" / "infragent").is_dir() else code
            env["PYTHONPATH"] = os.pathsep.join([str(source)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
        self.name = name
        self.proc = subprocess.Popen([sys.executable, "-m", "infragent.probes.step_worker"], cwd=code, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self._send({"config": config})
        self.code = ""
        self.units: dict[str, int] = {}  # units run, per shape (the warm-up a shape still needs)

    def ready(self) -> "StepWorker":
        """Wait until the child has built its engine (start several first, then wait: they load in parallel)."""
        if not self.code:
            self.code = self._answer()["code"]
        return self

    def alive(self) -> bool:
        """Whether the child is still running."""
        return self.proc.poll() is None

    def run(self, unit: Unit, trace: Path | None = None) -> dict[str, Any]:
        """Run one unit (under the tracer, saved at trace, when given); its timings and tokens."""
        self.units[unit.shape] = self.units.get(unit.shape, 0) + 1
        return self._ask({"prompts": unit.prompts, "max_tokens": unit.max_tokens,
                          **({"trace": str(trace)} if trace else {})})

    def warm(self, unit: Unit) -> None:
        """Run the unit until this child has run it WARMUP_UNITS times: a fresh process's first units pay
        for page faults and allocator growth."""
        while self.units.get(unit.shape, 0) < WARMUP_UNITS:
            self.run(unit)

    def _ask(self, message: dict) -> dict:
        self._send(message)
        return self._answer()

    def _send(self, message: dict) -> None:
        try:
            self.proc.stdin.write(json.dumps(message) + "\n")  # type: ignore[union-attr]
            self.proc.stdin.flush()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):
            pass  # the answer that never comes says why

    def _answer(self) -> dict:
        watchdog = threading.Timer(ANSWER_TIMEOUT_S, self.proc.kill)  # a hung child must not hang the loop
        watchdog.start()
        try:
            line = self.proc.stdout.readline()  # type: ignore[union-attr]
        except OSError:
            line = ""
        finally:
            watchdog.cancel()
        if not line:
            self.close()
            tail = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()[-3:]  # type: ignore[union-attr]
            raise StepBenchError(f"the {self.name} engine's step worker died: {' | '.join(tail) or 'no output'}")
        return json.loads(line)

    def close(self) -> None:
        """Stop the child."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def check_tokens(baseline: StepWorker, candidate: StepWorker, max_tokens: int = 8) -> Feedback:
    """The output check in-process: greedy tokens of fixed prompts must be identical."""
    unit = Unit([list(p) for p in CHECK_PROMPTS_IDS], max_tokens)
    ours, theirs = baseline.run(unit)["tokens"], candidate.run(unit)["tokens"]
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    finding = (f"greedy tokens differ on {len(differ)}/{len(ours)} prompts (first: prompt {differ[0]}: baseline "
               f"{ours[differ[0]]}, candidate {theirs[differ[0]]})" if differ else
               f"greedy tokens identical on {len(ours)} prompts ({max_tokens} tokens each), engines from "
               f"{baseline.code} and {candidate.code}")
    return Feedback("check", "fail" if differ else "pass", finding, numbers={"mismatches": Measure(len(differ))},
                    locality={"baseline_code": baseline.code, "candidate_code": candidate.code},
                    details={"mismatches": [{"prompt": i, "baseline": ours[i], "candidate": theirs[i]} for i in differ]})


def step_rounds(baseline: StepWorker, candidate: StepWorker, unit: Unit, rounds: int,
                done: Callable[[dict[str, list[float]]], bool] = lambda logs: False) -> dict[str, list[float]]:
    """Alternating-order rounds after each child's warm-up, until `rounds` or done(logs) from MIN_ROUNDS on:
    per round the log ratios candidate/baseline of the total, the prefill time and the decode time per step."""
    baseline.warm(unit)
    candidate.warm(unit)
    logs: dict[str, list[float]] = {"total": [], "prefill": [], "decode": []}
    for r in range(rounds):
        first, second = (baseline, candidate) if r % 2 == 0 else (candidate, baseline)
        ran = {first.name: first.run(unit), second.name: second.run(unit)}
        b, c = ran[baseline.name], ran[candidate.name]
        logs["total"].append(math.log((c["prefill_ns"] + c["decode_ns"]) / (b["prefill_ns"] + b["decode_ns"])))
        logs["prefill"].append(math.log(max(c["prefill_ns"], 1) / max(b["prefill_ns"], 1)))
        per_step = [max(x["decode_ns"], 1) / max(x["decode_steps"], 1) for x in (b, c)]
        logs["decode"].append(math.log(per_step[1] / per_step[0]))
        if r + 1 >= MIN_ROUNDS and done(logs):
            break
    return logs


def step_bench(baseline: StepWorker, candidate: StepWorker, unit: Unit, floor: float,
               rounds: int = MAX_ROUNDS) -> Feedback:
    """Candidate against baseline, step by step: pass = faster beyond the floor, fail = slower beyond it;
    the rounds stop as soon as a win is shown or ruled out."""
    started = time.monotonic()

    def decided(logs: dict[str, list[float]]) -> bool:
        estimate = block_estimate(logs["total"], CONFIDENCE)
        return step_verdict(estimate, floor) == "win" or not could_still_win(estimate, floor)

    logs = step_rounds(baseline, candidate, unit, rounds, decided)
    ran = len(logs["total"])
    estimates = {phase: block_estimate(values, CONFIDENCE) for phase, values in logs.items()}
    outcome = step_verdict(estimates["total"], floor)
    numbers = {f"{phase}_ratio": Measure(e.ratio, "x", e.lo, e.hi, e.blocks) for phase, e in estimates.items()}
    numbers["floor"] = Measure(floor, "log")
    phases = ", ".join(f"{phase} x{e.ratio:.3f} [{e.lo:.3f}, {e.hi:.3f}]" for phase, e in estimates.items())
    finding = (f"engine steps candidate/baseline: {phases} over {ran} alternating rounds "
               f"({len(unit.prompts)} prompts, {unit.max_tokens} tokens each; {CONFIDENCE:.0%} CI per look); a win "
               f"needs total x<{math.exp(-floor):.3f}: " + {"win": "a real win", "loss": "a real loss",
                                                             "inconclusive": "inconclusive"}[outcome])
    verdict = {"win": "pass", "loss": "fail", "inconclusive": "inconclusive"}[outcome]
    return Feedback("step_bench", verdict, finding, numbers,
                    locality={"slower_phase": max(estimates, key=lambda p: estimates[p].ratio)},
                    details={"outcome": outcome, "log_ratios": logs, "rounds": ran,
                             "seconds": round(time.monotonic() - started, 2)})


def step_verdict(estimate: BlockEstimate, floor: float) -> str:
    """"win" (the whole interval faster than the floor), "loss" (the whole interval slower than it), or
    "inconclusive"."""
    if estimate.blocks < 2:
        return "inconclusive"
    if estimate.hi < math.exp(-floor):
        return "win"
    if estimate.lo > math.exp(floor):
        return "loss"
    return "inconclusive"


def step_aa_floor(estimate: BlockEstimate) -> float:
    """The step bench's floor from its A/A: the interval's outer bound (log), at least STEP_MIN_FLOOR."""
    if estimate.blocks < 2:
        return math.inf
    return max(STEP_MIN_FLOOR, abs(math.log(estimate.lo)), abs(math.log(estimate.hi)))


def step_floor(baseline: StepWorker, twin: StepWorker, unit: Unit, rounds: int = MAX_ROUNDS) -> Feedback:
    """The A/A floor of the step bench: the baseline's engine against a second child of the same code."""
    logs = step_rounds(baseline, twin, unit, rounds)
    estimate = block_estimate(logs["total"], 0.95)
    floor = step_aa_floor(estimate)
    return Feedback("calibration", "pass", f"step A/A: two engines of the baseline's code differ by x{estimate.ratio:.3f} "
                    f"[{estimate.lo:.3f}, {estimate.hi:.3f}] over {rounds} rounds; a step win needs "
                    f"x<{math.exp(-floor):.3f}", numbers={"aa_floor": Measure(floor, "log"),
                                                         "aa_ratio": Measure(estimate.ratio, "x", estimate.lo,
                                                                             estimate.hi, rounds)},
                    details={"log_ratios": logs})


def trace_engine_code(worker: StepWorker, unit: Unit, path: Path) -> Feedback:
    """record + analyze on one copy of the engine: the unit under the tracer in its child, then attributed."""
    from infragent.probes.analyze import analyze

    feedback = analyze(worker.run(unit, trace=path)["trace"])
    feedback.locality["code"] = worker.code
    return feedback


def span_shift(baseline: StepWorker, candidate: StepWorker, unit: Unit, folder: Path) -> Feedback:
    """Where a step-bench difference comes from: one traced unit on each engine, exclusive time per span,
    candidate minus baseline; the span that moved most is the change's locality."""
    from infragent.analysis.breakdown import breakdown
    from infragent.analysis.trace_load import columns_from_trace
    from infragent.trace_model import Trace

    stamp = time.strftime("%Y%m%d-%H%M%S")
    own = {}
    for side, worker in (("baseline", baseline), ("candidate", candidate)):
        trace = Trace.load(worker.run(unit, trace=folder / f"trace-{side}-{stamp}.json")["trace"])
        own[side] = {row.key: row.exclusive_ns for row in breakdown(columns_from_trace(trace))}
    names = set(own["baseline"]) | set(own["candidate"])
    shift = {n: own["candidate"].get(n, 0) - own["baseline"].get(n, 0) for n in names}
    moved = sorted(shift, key=lambda n: -abs(shift[n]))[:5]
    total = sum(own["baseline"].values()) or 1
    top = moved[0] if moved else ""
    finding = ("exclusive time per span, candidate - baseline (one traced unit each): "
               + ", ".join(f"{n} {shift[n] / 1e6:+.1f} ms ({shift[n] / total:+.0%})" for n in moved)
               + (f"; the change is in {top!r}" if top else ""))
    return Feedback("record", "pass", finding, {f"{n}.shift_ms": Measure(shift[n] / 1e6, "ms") for n in moved},
                    locality={"span": top}, details={"exclusive_ns": own})
