"""The step bench's statistics on children with known speeds: it stops at MIN_ROUNDS once a win is shown or
ruled out, never calls a neutral candidate a win yet still finds a modest real one, pays a child's warm-up
once per shape, its floor clears the A/A interval's outer bound (at least STEP_MIN_FLOOR), and the A/A runs
only for a win, only as far as that win needs."""
from __future__ import annotations

import math
import random

import pytest

from infragent.analysis.blocks import block_estimate
from infragent.probes.step_bench import (MAX_ROUNDS, MIN_ROUNDS, STEP_MIN_FLOOR, WARMUP_UNITS, Unit, step_aa_floor,
                                         step_bench, step_floor)


class TimedChild:
    """A stand-in for a step worker's child: each unit takes `speed` x 100 ms of prefill and 8 decode steps of
    `speed` x 50 ms, with `noise` (relative, Gaussian) per unit; on a `busy` machine each phase's wall time
    also carries a run-queue wait of up to busy x its own time (uniform), reported as that phase's wait."""

    def __init__(self, name: str, speed: float, noise: float, seed: int, busy: float = 0.0) -> None:
        self.name, self.speed, self.noise, self.busy = name, speed, noise, busy
        self.rng = random.Random(seed)
        self.units: dict[str, int] = {}
        self.ran = 0
        self.wall_ns = self.wait_ns = 0

    def run(self, unit: Unit) -> dict:
        self.ran += 1
        scale = self.speed * math.exp(self.rng.gauss(0.0, self.noise))
        answer = {"decode_steps": 8, "tokens": [[1] * unit.max_tokens for _ in unit.prompts]}
        for phase, own in (("prefill", 100e6 * scale), ("decode", 8 * 50e6 * scale)):
            wait = own * self.rng.uniform(0.0, self.busy)
            answer |= {f"{phase}_ns": int(own + wait), f"{phase}_wait_ns": int(wait)}
            self.wall_ns, self.wait_ns = self.wall_ns + int(own + wait), self.wait_ns + int(wait)
        return answer

    def warm(self, unit: Unit) -> None:
        while self.units.get(unit.shape, 0) < WARMUP_UNITS:
            self.units[unit.shape] = self.units.get(unit.shape, 0) + 1
            self.run(unit)


UNIT = Unit([[1] * 64, [2] * 40], 8)


@pytest.mark.parametrize("speed, verdict", [(0.6, "pass"), (1.8, "fail")])
def test_a_clear_verdict_stops_at_the_first_look(speed: float, verdict: str) -> None:
    base, cand = TimedChild("baseline", 1.0, 0.02, 1), TimedChild("candidate", speed, 0.02, 2)
    fb = step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
    assert fb.verdict == verdict and fb.details["rounds"] == MIN_ROUNDS
    assert cand.ran == WARMUP_UNITS + MIN_ROUNDS


def test_a_neutral_candidate_is_never_a_win_and_is_given_up_on_early() -> None:
    wins = 0
    rounds = []
    for seed in range(200):
        base, cand = TimedChild("baseline", 1.0, 0.06, seed), TimedChild("candidate", 1.0, 0.06, 1000 + seed)
        fb = step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
        wins += fb.verdict == "pass"
        rounds.append(fb.details["rounds"])
    assert wins == 0
    assert MIN_ROUNDS < sum(rounds) / len(rounds) < MAX_ROUNDS  # not decided at a glance, nor run to the cap


def test_a_modest_real_win_is_still_found() -> None:
    found = 0
    for seed in range(50):
        base, cand = TimedChild("baseline", 1.0, 0.04, seed), TimedChild("candidate", 0.88, 0.04, 500 + seed)
        found += step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR).verdict == "pass"  # type: ignore[arg-type]
    assert found >= 45  # giving up early on neutral candidates must not give up on a 12% win


def test_the_baseline_child_warms_up_once_for_many_candidates() -> None:
    base = TimedChild("baseline", 1.0, 0.01, 0)
    for seed in range(3):
        step_bench(base, TimedChild("candidate", 0.5, 0.01, seed), UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
    assert base.ran == WARMUP_UNITS + 3 * MIN_ROUNDS


def test_the_step_floor_clears_the_aa_interval_and_the_minimum() -> None:
    tight = block_estimate([0.001, -0.002, 0.0015, -0.001, 0.0005, 0.0, 0.001, -0.0005])
    assert step_aa_floor(tight) == STEP_MIN_FLOOR
    wide = block_estimate([-0.08, -0.02, -0.06, -0.01, -0.07, -0.03, -0.05, -0.04])
    assert step_aa_floor(wide) == pytest.approx(-math.log(wide.lo)) and step_aa_floor(wide) > STEP_MIN_FLOOR
    assert step_aa_floor(block_estimate([0.01])) == math.inf


def test_no_aa_is_run_for_a_candidate_that_does_not_win() -> None:
    asked: list[float] = []
    for speed in (1.8, 1.0):
        base, cand = TimedChild("baseline", 1.0, 0.02, 3), TimedChild("candidate", speed, 0.02, 4)
        step_bench(base, cand, UNIT, aa=lambda margin: asked.append(margin) or STEP_MIN_FLOOR)  # type: ignore[arg-type]
    assert asked == []


def test_a_win_is_held_against_the_aa_floor_with_its_margin() -> None:
    base, cand = TimedChild("baseline", 1.0, 0.02, 5), TimedChild("candidate", 0.7, 0.02, 6)
    asked: list[float] = []
    won = step_bench(base, cand, UNIT, aa=lambda margin: asked.append(margin) or 0.08)  # type: ignore[arg-type]
    assert won.verdict == "pass" and len(asked) == 1 and asked[0] > 0.08
    base, cand = TimedChild("baseline", 1.0, 0.02, 5), TimedChild("candidate", 0.7, 0.02, 6)
    lost = step_bench(base, cand, UNIT, aa=lambda margin: 0.6)  # type: ignore[arg-type]  # twins differ by 80%
    assert lost.verdict == "inconclusive" and lost.numbers["floor"].value == 0.6


def test_the_aa_stops_once_its_floor_is_below_the_margin_and_resumes_for_a_smaller_one() -> None:
    base, twin = TimedChild("baseline", 1.0, 0.02, 7), TimedChild("twin", 1.0, 0.02, 8)
    wide = step_floor(base, twin, UNIT, margin=0.3)  # type: ignore[arg-type]
    assert wide.numbers["aa_ratio"].n == MIN_ROUNDS
    narrow = step_floor(base, twin, UNIT, margin=0.01, logs=wide.details["log_ratios"])  # type: ignore[arg-type]
    assert narrow.numbers["aa_ratio"].n == MAX_ROUNDS and twin.ran == WARMUP_UNITS + MAX_ROUNDS


def test_a_busy_machines_run_queue_waits_are_taken_out_of_both_sides() -> None:
    """Waits of up to 3x a step's own time (another process holding the CPU) would swamp a 20% win in wall
    time; the bench times each phase less its wait, finds the win, and says the machine was busy."""
    def run(busy: float) -> dict:
        baseline = TimedChild("baseline", 1.0, 0.02, seed=5, busy=busy)
        candidate = TimedChild("candidate", 0.8, 0.02, seed=6, busy=busy)
        feedback = step_bench(baseline, candidate, Unit([[1] * 32] * 2, 8))  # type: ignore[arg-type]
        return {"verdict": feedback.verdict, "ratio": feedback.numbers["total_ratio"].value,
                "wait_share": feedback.details["wait_share"], "finding": feedback.finding}

    quiet, busy = run(0.0), run(3.0)
    assert quiet["verdict"] == busy["verdict"] == "pass"
    assert abs(busy["ratio"] - 0.8) < 0.05 and quiet["wait_share"] == 0.0 and busy["wait_share"] > 0.4
    assert "busy machine" in busy["finding"] and "busy machine" not in quiet["finding"]
