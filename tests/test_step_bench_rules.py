"""The step bench's statistics on children with known speeds: it stops at MIN_ROUNDS once a win is shown or
ruled out, runs every round while undecided, never calls a neutral candidate a win, pays a child's warm-up
once per shape, and its floor clears the A/A interval's outer bound (at least STEP_MIN_FLOOR)."""
from __future__ import annotations

import math
import random

import pytest

from infragent.analysis.blocks import block_estimate
from infragent.probes.step_bench import (MAX_ROUNDS, MIN_ROUNDS, STEP_MIN_FLOOR, WARMUP_UNITS, Unit, step_aa_floor,
                                         step_bench)


class TimedChild:
    """A stand-in for a step worker's child: each unit takes `speed` x 100 ms of prefill and 8 decode steps of
    `speed` x 50 ms, with `noise` (relative, Gaussian) per unit."""

    def __init__(self, name: str, speed: float, noise: float, seed: int) -> None:
        self.name, self.speed, self.noise = name, speed, noise
        self.rng = random.Random(seed)
        self.units: dict[str, int] = {}
        self.ran = 0

    def run(self, unit: Unit) -> dict:
        self.ran += 1
        scale = self.speed * math.exp(self.rng.gauss(0.0, self.noise))
        return {"prefill_ns": int(100e6 * scale), "decode_ns": int(8 * 50e6 * scale), "decode_steps": 8,
                "tokens": [[1] * unit.max_tokens for _ in unit.prompts]}

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


def test_a_neutral_candidate_is_never_a_win_and_noise_runs_every_round() -> None:
    wins = 0
    rounds = []
    for seed in range(200):
        base, cand = TimedChild("baseline", 1.0, 0.06, seed), TimedChild("candidate", 1.0, 0.06, 1000 + seed)
        fb = step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
        wins += fb.verdict == "pass"
        rounds.append(fb.details["rounds"])
    assert wins == 0
    assert max(rounds) == MAX_ROUNDS  # noisy rounds cannot rule a win out at the first look


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
