"""The step microbenchmark: the engine's prefill and decode steps timed in-process, baseline against
candidate, each engine built from its own copy of the code (a worktree's src/) in its own child
(probes/step_worker.py). The verdict comes from blocks: each block is a fresh pair of children, one per side,
that run PAIR_ROUNDS units in lockstep (one engine step each in turn, the side that steps first alternating
between rounds), so the machine's moods fall on both; its number is the mean log ratio (candidate/baseline) of
its rounds. The side forked first alternates between blocks.
Each step is timed less the run-queue wait within it (the child's schedstat), so a busy machine adds its
waits to neither side. Seconds, not minutes: a patch that makes the engine slower or changes its greedy
tokens is refuted before any server starts.

Why fresh pairs: a child has a speed of its own. Four children of the same code, run in a random order for
12 rounds, differed by up to 10% with offsets that held from the first half of the rounds to the second
(sd 2.6-4.6% against 0.7-1.4% that round noise explains; AMD EPYC Zen 3, two cores; gone when the children
ran on one CPU; not order, not warm-up: benchmarks/step_aa_bias.py, docs/BENCHMARKS.md). Rounds on one pair
average the noise but never that offset, so an A/A of two children read x1.067 [1.020, 1.116] and a
candidate's child carried its own. Over fresh pairs the offsets are samples like any other noise, and the
interval over blocks covers them. The child forked first of a set was the fast one more often than chance
(5 of 9 sessions of four), and A/As whose blocks forked the baseline first 9 times in 16 read x0.985-x1.025 (mean x1.008):
so the side forked first alternates, and a verdict is read only at an even number of blocks. The baseline warms
first and leads each block's rounds: the candidate side's small lag in A/As (x1.011 [1.001, 1.021] over 176
in-loop blocks) was not shown to come from order; it was there in all four orders of fork and lead
(benchmarks/step_lead_order.py, docs/BENCHMARKS.md).
The price is a wider, heavy-tailed spread per block (a pair's two offsets are in it, and now and then a pair
is 10-25% off: sd 4-11% of a step against ~1.3% for rounds on one pair). It is paid in blocks and in a
robust centre: with at most 16 blocks and a plain t interval a planted 10% slowdown's fix (x0.90-0.94) was
shown in 3 of 8 runs (benchmarks/step_bench_power.py); blocks cost ~2.3 s, so the cap is 32, and the centre
is a 20% trimmed mean with Yuen's interval (STEP_TRIM), so a few wild pairs neither move nor widen it.
Why lockstep: this machine's host changes its speed within a second (two back-to-back runs of a fixed 5 ms loop
differ by 7-18% sd; on a noisy day an 11 ms loop's median moved 11.8 -> 19.2 ms in a minute, no steal time
counted), so two units run one after the other saw different seconds. Stepping the pair in turn, each ~50 ms
step of one side has one of the other's beside it: over 12 fresh A/A pairs each, interleaved, the block-mean sd fell from 0.066 to 0.036 (benchmarks/step_lockstep.py; pinning each
child's threads to fixed CPUs as well did not help, 0.062). What it costs: each step starts after the other
child's step has run through the caches, as no step of a server does.

A step win is strict, because a patch with one goes on to an end-to-end run that only guards against
regressions: the candidate's whole 99% interval must lie beyond the floor, at least STEP_MIN_FLOOR. The A/A
sets the floor higher only by a bias its 99% interval shows: not at all when it contains 1 (the candidate's
interval already holds the noise; holding it to the A/A's outer bound too counted the noise twice, and a 10%
fix was refused in 1 of 2 runs at a floor of 5.7% from an A/A of x0.99 [0.94, 1.06]; its centre is that noise
too), its outer bound when its interval excludes 1 (a bias shown). The blocks stop early, from MIN_ROUNDS on, once the
verdict is known: a win, or no win reachable by MAX_ROUNDS. A win is read only from MIN_WIN_BLOCKS blocks on
(~18 s of pairs): a no-op once read x0.939 [0.933, 0.944] over 4 blocks within 0.5% of one another, where the same
run's A/A blocks spread 5% and its end-to-end run showed no change (session 41). With 4 blocks the interval rests
on a spread with 3 degrees of freedom, and a few seconds of the machine that favour one side can fill them all.

The A/A is measured only as far as a decision needs it. A candidate that does not win at STEP_MIN_FLOOR
cannot win at any floor, so no A/A is run for it; a candidate that does win there is held against the A/A,
whose blocks (the baseline's code against itself) stop as soon as its floor is known to lie below the
win's margin. Its blocks are kept, so a later, smaller win extends the same A/A.
"""
from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infragent.analysis.blocks import aa_floor, block_estimate, block_verdict, could_win_by
from infragent.probes.contention import WAIT_SHARE
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.step_child import start_child

CHECK_PROMPTS_IDS = ([1, 504, 3458, 282, 4649, 314], [1, 563, 14881, 26, 6, 1435, 339, 42], [1, 22862, 1768, 288])
CONFIDENCE = 0.99  # per look, from MIN_ROUNDS to MAX_ROUNDS
MIN_ROUNDS = 4  # blocks; a look at 3 (2 degrees of freedom) doubled false wins in simulation: 0.25% vs 0.1%
MIN_WIN_BLOCKS = 8  # blocks before a win is read (a loss, or a win out of reach, is read from MIN_ROUNDS)
MAX_ROUNDS = 32  # blocks (even: each side forked first in half of them); ~2.3 s each for the llama engine
PAIR_ROUNDS = 2  # alternating rounds per pair of children (a block): one each way round
STEP_TRIM = 0.2  # of the blocks, cut from each end before the mean (Yuen's trimmed mean: block_estimate)
STEP_MIN_FLOOR = 0.03  # the least step win worth a server launch (a fresh-pair A/A's 95% bound is ~3-4%)
WARMUP_UNITS = 1  # units of a shape a child runs before its timings count: only a shape's first is slow (+18%)
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
        self.name, self.code_path, self.config = name, code, config
        self.child = start_child(code)
        self.proc = self.child.proc
        self._send({"config": config})
        self.code = ""
        self.units: dict[str, int] = {}  # units run, per shape (the warm-up a shape still needs)
        self.tokens_of: dict[str, list[list[int]]] = {}  # greedy tokens per unit: one engine's are fixed
        self.wall_ns = self.wait_ns = 0  # over every unit run: wall time, and the run-queue wait within it

    def sibling(self) -> "StepWorker":
        """A fresh child of the same code and config (started, not yet waited for)."""
        return StepWorker(self.code_path, self.config, self.name)

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
        return self._counted(self._ask(self._unit(unit, **({"trace": str(trace)} if trace else {}))))

    def begin(self, unit: Unit) -> None:
        """Start a unit in lockstep: its requests are added, and each step waits for step()."""
        self._send(self._unit(unit, lockstep=True))

    def _unit(self, unit: Unit, **extra: Any) -> dict[str, Any]:
        """The message that starts a unit, counted as run (warm-up is per shape)."""
        self.units[unit.shape] = self.units.get(unit.shape, 0) + 1
        return {"prompts": unit.prompts, "max_tokens": unit.max_tokens, **extra}

    def step(self) -> dict[str, Any] | None:
        """One engine step of the unit begun; None while steps remain, then the unit's timings and tokens."""
        answer = self._ask({"step": True})
        return self._counted(answer) if answer.get("done") else None

    def _counted(self, answer: dict[str, Any]) -> dict[str, Any]:
        self.wall_ns += answer["prefill_ns"] + answer["decode_ns"]
        self.wait_ns += answer.get("prefill_wait_ns", 0) + answer.get("decode_wait_ns", 0)
        return answer

    def tokens(self, unit: Unit) -> list[list[int]]:
        """The unit's greedy tokens on this engine (run once; the same engine gives the same tokens)."""
        key = json.dumps([unit.prompts, unit.max_tokens])
        if key not in self.tokens_of:
            self.tokens_of[key] = self.run(unit)["tokens"]
        return self.tokens_of[key]

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
            self.proc.kill()
            self.proc.wait()
            tail = self.child.stderr_tail()
            self.close()
            raise StepBenchError(f"the {self.name} engine's step worker died: {tail or 'no output'}")
        return json.loads(line)

    def close(self) -> None:
        """Stop the child."""
        self.child.close()


class StepAA:
    """The step bench's A/A for one engine config, kept for a run: a twin child of the baseline's code,
    started when a win first needs the floor, and the blocks run so far against one baseline child."""

    def __init__(self, code: Path | None, config: dict[str, Any]) -> None:
        self.code, self.config = code, config
        self.twin: StepWorker | None = None
        self.baseline: StepWorker | None = None
        self.logs: dict[str, list[float]] | None = None

    def floor(self, baseline: StepWorker, unit: Unit, margin: float) -> tuple[float, Feedback | None]:
        """The floor, measured as far as margin needs; with the A/A's record where this call ran blocks."""
        if self.twin is None or not self.twin.alive() or baseline is not self.baseline:
            self.close()
            self.twin, self.baseline, self.logs = StepWorker(self.code, self.config, "twin").ready(), baseline, None
        before = len(self.logs["total"]) if self.logs else 0
        measured = step_floor(baseline, self.twin, unit, margin, self.logs)
        self.logs = measured.details["log_ratios"]
        floor = float(measured.numbers["aa_floor"].value)
        return floor, (measured if len(self.logs["total"]) > before else None)

    def close(self) -> None:
        """Stop the twin."""
        if self.twin is not None:
            self.twin.close()
        self.twin = None


def check_tokens(baseline: StepWorker, candidate: StepWorker, max_tokens: int = 8) -> Feedback:
    """The output check in-process: greedy tokens of fixed prompts must be identical."""
    unit = Unit([list(p) for p in CHECK_PROMPTS_IDS], max_tokens)
    ours, theirs = baseline.tokens(unit), candidate.tokens(unit)
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    finding = (f"greedy tokens differ on {len(differ)}/{len(ours)} prompts (first: prompt {differ[0]}: baseline "
               f"{ours[differ[0]]}, candidate {theirs[differ[0]]})" if differ else
               f"greedy tokens identical on {len(ours)} prompts ({max_tokens} tokens each), engines from "
               f"{baseline.code} and {candidate.code}")
    return Feedback("check", "fail" if differ else "pass", finding, numbers={"mismatches": Measure(len(differ))},
                    locality={"baseline_code": baseline.code, "candidate_code": candidate.code},
                    details={"mismatches": [{"prompt": i, "baseline": ours[i], "candidate": theirs[i]} for i in differ]})


def step_rounds(baseline: StepWorker, candidate: StepWorker, unit: Unit, rounds: int,
                done: Callable[[dict[str, list[float]]], bool] = lambda logs: False,
                logs: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
    """Blocks added to logs (earlier blocks of the same comparison) until there are `rounds`, or done(logs)
    at an even count from MIN_ROUNDS on: per block the mean log ratios candidate/baseline of the total, the
    prefill time and the decode time per step over PAIR_ROUNDS alternating rounds. Every block runs on a
    fresh pair of children, siblings of the two given (module docstring); which side is forked first
    alternates, and the looks fall on even counts, so each side is first equally often."""
    logs = logs if logs is not None else {"total": [], "prefill": [], "decode": []}
    while len(logs["total"]) < rounds and not (len(logs["total"]) >= MIN_ROUNDS and len(logs["total"]) % 2 == 0
                                               and done(logs)):
        if len(logs["total"]) % 2 == 0:  # the child forked first may start (and stay) a little faster
            pair = (baseline.sibling(), candidate.sibling())
        else:
            fresh = candidate.sibling()
            pair = (baseline.sibling(), fresh)
        try:
            block = _block(pair[0].ready(), pair[1].ready(), unit)
        finally:
            for given, sibling in zip((baseline, candidate), pair):
                sibling.close()
                given.wall_ns, given.wait_ns = given.wall_ns + sibling.wall_ns, given.wait_ns + sibling.wait_ns
        for phase, values in block.items():
            logs[phase].append(sum(values) / len(values))
    return logs


def _block(baseline: StepWorker, candidate: StepWorker, unit: Unit, candidate_first: bool = False
           ) -> dict[str, list[float]]:
    """PAIR_ROUNDS rounds in lockstep on one pair, after each child's warm-up: their log ratios per phase. The
    side that warms first, and steps first in even rounds, is the candidate when candidate_first (a bench's
    question; the step bench leads with the baseline)."""
    lead, follow = (candidate, baseline) if candidate_first else (baseline, candidate)
    lead.warm(unit)
    follow.warm(unit)
    block: dict[str, list[float]] = {"total": [], "prefill": [], "decode": []}
    for r in range(PAIR_ROUNDS):
        first, second = (lead, follow) if r % 2 == 0 else (follow, lead)
        ran = dict(zip((id(first), id(second)), lockstep(first, second, unit)))
        b, c = ran[id(baseline)], ran[id(candidate)]
        block["total"].append(math.log(max(own_ns(c, "prefill") + own_ns(c, "decode"), 1)
                                       / max(own_ns(b, "prefill") + own_ns(b, "decode"), 1)))
        block["prefill"].append(math.log(own_ns(c, "prefill") / own_ns(b, "prefill")))
        per_step = [own_ns(x, "decode") / max(x["decode_steps"], 1) for x in (b, c)]
        block["decode"].append(math.log(per_step[1] / per_step[0]))
    return block


def lockstep(first: StepWorker, second: StepWorker, unit: Unit) -> tuple[dict[str, Any], dict[str, Any]]:
    """One unit on each child, their engine steps taken in turn (first's, second's, first's, ...; a child that
    has finished drops out): both answers. Run one after the other, two units saw different seconds of the
    machine; stepped in turn, each ~50 ms step of one side has the other's beside it."""
    first.begin(unit)
    second.begin(unit)
    answers: list[dict[str, Any] | None] = [None, None]
    while None in answers:
        for i, worker in enumerate((first, second)):
            if answers[i] is None:
                answers[i] = worker.step()
    return answers[0], answers[1]  # type: ignore[return-value]


def own_ns(answer: dict[str, Any], phase: str) -> int:
    """A phase's wall time less the run-queue wait within it (at least 1): what the step took, not what other
    processes holding the CPU added. On a quiet machine the wait is ~0 and this is the wall time; on a busy
    one the wait is most of the noise (2 hogs on 2 cores: A/A round spread 0.41 of wall, 0.09 of this)."""
    return max(answer[f"{phase}_ns"] - answer.get(f"{phase}_wait_ns", 0), 1)


def step_bench(baseline: StepWorker, candidate: StepWorker, unit: Unit, floor: float = STEP_MIN_FLOOR,
               aa: Callable[[float], float] | None = None, rounds: int = MAX_ROUNDS) -> Feedback:
    """Candidate against baseline, step by step: pass = faster beyond the floor, fail = slower beyond it;
    the rounds stop as soon as a win is shown or out of reach. aa(margin): the A/A floor, measured as far as
    it takes to tell whether it lies below margin (log); a win at `floor` is held against it, and the rounds
    go on against the A/A's floor where that is higher."""
    started, queued, asked = time.monotonic(), QueueWait(baseline, candidate), floor
    logs: dict[str, list[float]] = {"total": [], "prefill": [], "decode": []}
    while True:
        def decided(logs: dict[str, list[float]], floor: float = floor) -> bool:
            return step_look(logs["total"], floor, rounds) != "go on"

        logs = step_rounds(baseline, candidate, unit, rounds, decided, logs)
        total = block_estimate(logs["total"], CONFIDENCE, STEP_TRIM)
        if aa is None or step_look(logs["total"], floor, rounds) != "win":
            break
        margin = -math.log(total.hi)
        measured = aa(margin)
        floor = max(floor, measured)
        if measured < margin:
            break  # the win clears the A/A's floor too
        # the A/A is wider than this win: more rounds may still show one beyond it
    ran = len(logs["total"])
    estimates = {phase: block_estimate(values, CONFIDENCE, STEP_TRIM) for phase, values in logs.items()}
    outcome = block_verdict(estimates["total"], floor)
    if outcome == "win" and ran < MIN_WIN_BLOCKS:
        outcome = "inconclusive"
    numbers = {f"{phase}_ratio": Measure(e.ratio, "x", e.lo, e.hi, e.blocks) for phase, e in estimates.items()}
    numbers["floor"] = Measure(floor, "log")
    phases = ", ".join(f"{phase} x{e.ratio:.3f} [{e.lo:.3f}, {e.hi:.3f}]" for phase, e in estimates.items())
    said = {"win": "a real win", "loss": "a real loss",
            "inconclusive": "not shown (inconclusive: neither a win nor a loss beyond the floor)"}[outcome]
    finding = (f"engine steps candidate/baseline: {phases} over {ran} blocks (a fresh pair of children each, "
               f"{PAIR_ROUNDS} alternating rounds; {len(unit.prompts)} prompts, {unit.max_tokens} tokens each; "
               f"{CONFIDENCE:.0%} CI per look); a win needs the whole total interval below x{math.exp(-floor):.3f} "
               f"({_floor_source(floor, asked)}): {said}" + queued.said())
    verdict = {"win": "pass", "loss": "fail", "inconclusive": "inconclusive"}[outcome]
    return Feedback("step_bench", verdict, finding, numbers,
                    locality={"slower_phase": max(estimates, key=lambda p: estimates[p].ratio)},
                    details={"outcome": outcome, "log_ratios": logs, "rounds": ran, "wait_share": queued.share(),
                             "seconds": round(time.monotonic() - started, 2)})


def step_look(total: list[float], floor: float, rounds: int = MAX_ROUNDS, least: int = MIN_WIN_BLOCKS) -> str:
    """What one look at the blocks' total log ratios says: "win" (the whole interval below the floor, over at
    least `least` blocks), "out of reach" (no win possible by `rounds` blocks: a loss, or too close to call),
    or "go on"."""
    estimate = block_estimate(total, CONFIDENCE, STEP_TRIM)
    if len(total) >= least and block_verdict(estimate, floor) == "win":
        return "win"
    return "go on" if could_win_by(estimate, floor, rounds) else "out of reach"


def _floor_source(floor: float, asked: float) -> str:
    """Where the floor came from, for the finding."""
    if floor > asked:
        return "the floor: the bias the step A/A shows, above the asked minimum"
    if asked == STEP_MIN_FLOOR:
        return "the floor: the least step win worth a server launch; the A/A, where run, lies within it"
    return "the floor asked for"


class QueueWait:
    """The share of the workers' wall time, from now on, that their engine threads spent waiting for a CPU."""

    def __init__(self, *workers: StepWorker) -> None:
        self.workers = workers
        self.start = [(w.wall_ns, w.wait_ns) for w in workers]

    def share(self) -> float:
        """Run-queue wait over wall time since construction (0.0 before any unit)."""
        wall = sum(w.wall_ns - s[0] for w, s in zip(self.workers, self.start))
        wait = sum(w.wait_ns - s[1] for w, s in zip(self.workers, self.start))
        return wait / wall if wall > 0 else 0.0

    def said(self) -> str:
        """A clause for a finding where the wait was large enough to matter ('' otherwise)."""
        share = self.share()
        return (f" (busy machine: the engines waited for a CPU {share:.0%} of their wall time; times are taken"
                f" less that wait)" if share > WAIT_SHARE else "")


def step_floor(baseline: StepWorker, twin: StepWorker, unit: Unit, margin: float = 0.0,
               logs: dict[str, list[float]] | None = None) -> Feedback:
    """The A/A floor of the step bench: the baseline's engine against a second child of the same code, rounds
    added (to logs, from an earlier call) until the floor is known to lie below margin (log: the distance of
    a win from no change) or there are MAX_ROUNDS (analysis/blocks.aa_floor: the least floor, or the A/A's
    outer bound where it shows a bias). The floor is read from the 99% interval, the decisions' own, which the
    early stop reads too, so that looking after every round cannot stop on a lucky one and the floor returned
    is the one the stop saw (at 95% a 4-block A/A of x1.037 [1.000, 1.075] stopped as "below the margin" and
    then set a floor of 7.3%, which refused a fix measured at x0.924 [0.909, 0.940]: session 41)."""
    def settled(logs: dict[str, list[float]]) -> bool:
        return aa_floor(block_estimate(logs["total"], CONFIDENCE, STEP_TRIM), STEP_MIN_FLOOR) < margin

    queued = QueueWait(baseline, twin)
    logs = step_rounds(baseline, twin, unit, MAX_ROUNDS, settled, logs)
    rounds = len(logs["total"])
    estimate = block_estimate(logs["total"], CONFIDENCE, STEP_TRIM)  # the interval the stop rule read
    floor = aa_floor(estimate, STEP_MIN_FLOOR)
    return Feedback("calibration", "pass", f"step A/A: two engines of the baseline's code differ by x{estimate.ratio:.3f} "
                    f"[{estimate.lo:.3f}, {estimate.hi:.3f}] over {rounds} blocks (fresh pairs; "
                    + ("contains 1: no bias beyond noise" if estimate.lo <= 1 <= estimate.hi else
                       "excludes 1: a bias, held against by its outer bound")
                    + f"); a step win needs its whole interval below x{math.exp(-floor):.3f}" + queued.said(),
                    numbers={"aa_floor": Measure(floor, "log"),
                             "aa_ratio": Measure(estimate.ratio, "x", estimate.lo, estimate.hi, rounds)},
                    details={"log_ratios": logs, "wait_share": queued.share()})


def trace_engine_code(worker: StepWorker, unit: Unit, path: Path) -> Feedback:
    """record + analyze on one copy of the engine: the unit under the tracer in its child, then attributed."""
    from infragent.probes.analyze import analyze

    feedback = analyze(worker.run(unit, trace=path)["trace"])
    feedback.locality["code"] = worker.code
    return locate_self_time(feedback, worker.code)


def span_table(details: dict, top: int = 8) -> str:
    """The top spans by own time and the spans with time in no child span, as one text for a model:
    "top spans by own time: 'mlp' 46% (12.3 ms in 320 calls), ...; in no child span: 'step' 13% (20% of its
    time; children 'mlp', 'attention') at engine.py:120-160"."""
    rows = [f"{r['key']!r} {r['share']:.0%} ({r['exclusive_ns'] / 1e6:.3g} ms in {r['count']} calls)"
            for r in details.get("top_spans", [])[:top] if r["share"] > 0]
    own = [f"{s['span']!r} {s['share']:.0%} ({s['self_ns'] / max(s['inclusive_ns'], 1):.0%} of its time; children "
           f"{', '.join(repr(c) for c in s['children'][:3])})" + (f" at {', '.join(s['code'][:2])}" if s.get("code") else "")
           for s in details.get("self_time", [])]
    return ("top spans by own time: " + ", ".join(rows or ["none"])
            + "; in no child span: " + (", ".join(own) if own else "no span with children holds 8% of busy time"))


def locate_self_time(feedback: Feedback, code: str | None) -> Feedback:
    """An analysis of an engine's trace with the code of its time in no child span: the `with span(...)`
    blocks of those spans in the engine's code folder, added to the finding and to details["self_time"]."""
    from infragent.analysis.self_time import code_range

    for own in feedback.details.get("self_time", [])[:2]:
        ranges = code_range(own["span"], Path(code)) if code else []
        if ranges:
            own["code"] = ranges
            feedback.finding += f"; {own['span']!r} is `with span({own['span']!r})` at {', '.join(ranges[:3])}"
    return feedback


def span_shift(baseline: StepWorker, candidate: StepWorker, unit: Unit, folder: Path) -> Feedback:
    """Where a step-bench difference comes from: one traced unit on each engine, exclusive time per span (and
    the threads' time in no span at all), candidate minus baseline; see shift_feedback."""
    from infragent.analysis.idle import own_time
    from infragent.analysis.trace_load import columns_from_trace
    from infragent.trace_model import Trace

    stamp = time.strftime("%Y%m%d-%H%M%S")
    own = {}
    for side, worker in (("baseline", baseline), ("candidate", candidate)):
        trace = Trace.load(worker.run(unit, trace=folder / f"trace-{side}-{stamp}.json")["trace"])
        own[side] = own_time(columns_from_trace(trace))
    return shift_feedback(own["baseline"], own["candidate"])


CHANGE_SHARE = 0.6  # of all spans' moves (absolute): a span that moved this much, the way the total did, holds it


def shift_feedback(baseline: dict[str, int], candidate: dict[str, int]) -> Feedback:
    """Candidate minus baseline own time per span; the change's locality is the span that holds CHANGE_SHARE of
    all the moves, in the whole change's direction (NO_SPAN when the change is in no span), else none:
    one traced unit each leaves a few % of noise on every span, so the largest mover alone proves nothing."""
    from infragent.analysis.idle import NO_SPAN

    names = set(baseline) | set(candidate)
    shift = {n: candidate.get(n, 0) - baseline.get(n, 0) for n in names}
    moved = sorted(shift, key=lambda n: -abs(shift[n]))[:5]
    total = sum(baseline.values()) or 1
    change = sum(shift.values())
    moves = sum(abs(v) for v in shift.values())
    top = moved[0] if moved and change and shift[moved[0]] * change > 0 and \
        abs(shift[moved[0]]) >= CHANGE_SHARE * moves else ""
    said = ("in no span: time between the threads' top-level spans" if top == NO_SPAN else repr(top))
    finding = ("own time per span, candidate - baseline (one traced unit each): "
               + ", ".join(f"{n} {shift[n] / 1e6:+.1f} ms ({shift[n] / total:+.0%})" for n in moved)
               + f"; in all {change / 1e6:+.1f} ms ({change / total:+.0%})"
               + (f"; the change is {said}" if top else "; no one span holds the change"))
    return Feedback("record", "pass", finding, {f"{n}.shift_ms": Measure(shift[n] / 1e6, "ms") for n in moved},
                    locality={"span": top}, details={"exclusive_ns": {"baseline": baseline, "candidate": candidate}})
