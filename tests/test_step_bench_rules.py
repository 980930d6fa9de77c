"""The step bench's statistics on children with known speeds: it stops at MIN_ROUNDS once a win is shown or
ruled out, never calls a neutral candidate a win yet still finds a modest real one, pays a child's warm-up
once per child, takes every block on a fresh pair of children (a child's own speed is noise over pairs, a
bias on one) and reads verdicts at even block counts, its floor clears the A/A interval's outer bound (at
least STEP_MIN_FLOOR), and the A/A runs only for a win, only as far as that win needs."""
from __future__ import annotations

import math
import random

import pytest

from infragent.analysis.blocks import aa_floor, block_estimate
from infragent.probes.step_bench import (MAX_ROUNDS, MIN_ROUNDS, MIN_WIN_BLOCKS, PAIR_ROUNDS, STEP_MIN_FLOOR,
                                         WARMUP_UNITS, Unit, step_bench, step_floor, step_look)


class TimedChild:
    """A stand-in for a step worker's child: each unit takes `speed` x 100 ms of prefill and 8 decode steps of
    `speed` x 50 ms, with `noise` (relative, Gaussian) per unit; on a `busy` machine each phase's wall time
    also carries a run-queue wait of up to busy x its own time (uniform), reported as that phase's wait."""

    def __init__(self, name: str, speed: float, noise: float, seed: int, busy: float = 0.0,
                 own_sd: float = 0.0) -> None:
        self.name, self.speed, self.noise, self.busy, self.own_sd = name, speed, noise, busy, own_sd
        self.seed, self.rng = seed, random.Random(seed)
        self.own = math.exp(self.rng.gauss(0.0, own_sd))  # a child's speed of its own (own_sd: spread over children)
        self.units: dict[str, int] = {}
        self.ran = 0
        self.wall_ns = self.wait_ns = 0
        self.siblings: list[TimedChild] = []

    def sibling(self) -> "TimedChild":
        fresh = TimedChild(self.name, self.speed, self.noise, self.seed * 7919 + len(self.siblings) + 1, self.busy,
                           self.own_sd)
        self.siblings.append(fresh)
        return fresh

    def ready(self) -> "TimedChild":
        return self

    def close(self) -> None:
        pass

    def run(self, unit: Unit) -> dict:
        self.ran += 1
        scale = self.speed * self.own * math.exp(self.rng.gauss(0.0, self.noise))
        answer = {"decode_steps": 8, "tokens": [[1] * unit.max_tokens for _ in unit.prompts]}
        for phase, own in (("prefill", 100e6 * scale), ("decode", 8 * 50e6 * scale)):
            wait = own * self.rng.uniform(0.0, self.busy)
            answer |= {f"{phase}_ns": int(own + wait), f"{phase}_wait_ns": int(wait)}
            self.wall_ns, self.wait_ns = self.wall_ns + int(own + wait), self.wait_ns + int(wait)
        return answer

    def begin(self, unit: Unit) -> None:  # lockstep: the whole unit at its one step
        self.begun = unit

    def step(self) -> dict:
        return self.run(self.begun)

    def warm(self, unit: Unit) -> None:
        while self.units.get(unit.shape, 0) < WARMUP_UNITS:
            self.units[unit.shape] = self.units.get(unit.shape, 0) + 1
            self.run(unit)


UNIT = Unit([[1] * 64, [2] * 40], 8)


@pytest.mark.parametrize("speed, verdict, blocks", [(0.6, "pass", MIN_WIN_BLOCKS), (1.8, "fail", MIN_ROUNDS)])
def test_a_clear_verdict_stops_at_the_first_look_that_may_read_it(speed: float, verdict: str, blocks: int) -> None:
    base, cand = TimedChild("baseline", 1.0, 0.02, 1), TimedChild("candidate", speed, 0.02, 2)
    fb = step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
    assert fb.verdict == verdict and fb.details["rounds"] == blocks
    assert cand.ran == 0 and len(cand.siblings) == blocks  # every block a fresh pair
    assert all(s.ran == WARMUP_UNITS + PAIR_ROUNDS for s in cand.siblings)  # each warms up first


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


def test_every_block_is_a_fresh_pair_and_a_verdict_is_read_at_an_even_count() -> None:
    base = TimedChild("baseline", 1.0, 0.01, 0)
    for seed in range(3):
        step_bench(base, TimedChild("candidate", 0.5, 0.01, seed), UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
    assert base.ran == 0 and len(base.siblings) == 3 * MIN_WIN_BLOCKS
    counts = {step_bench(TimedChild("baseline", 1.0, 0.06, s), TimedChild("candidate", 1.0, 0.06, 99 + s), UNIT,
                         floor=STEP_MIN_FLOOR).details["rounds"] for s in range(40)}  # type: ignore[arg-type]
    assert counts and all(n % 2 == 0 for n in counts), counts  # each side forked first equally often


def test_four_tight_blocks_are_no_win_yet() -> None:
    # a no-op's first 4 blocks in session 41 (sample case, run 3): x0.939 [0.933, 0.944] at 99%, read as a win
    noop = [math.log(r) for r in (0.9377, 0.9367, 0.9411, 0.9387)]
    assert step_look(noop, STEP_MIN_FLOOR, least=MIN_ROUNDS) == "win"  # the rule before MIN_WIN_BLOCKS
    assert step_look(noop, STEP_MIN_FLOOR) == "go on"


class TransientChild(TimedChild):
    """A candidate whose first `fast` siblings run at `speed` with no noise (a few seconds of the machine that
    favour it), and every later one like the baseline."""

    def __init__(self, name: str, speed: float, noise: float, seed: int, fast: int) -> None:
        super().__init__(name, 1.0, noise, seed)
        self.fast_speed, self.fast = speed, fast

    def sibling(self) -> TimedChild:
        fresh = super().sibling()
        if len(self.siblings) <= self.fast:
            fresh.speed, fresh.noise = self.fast_speed, 0.0
        return fresh


def test_a_transient_that_favours_the_candidate_for_the_first_look_is_no_win_by_itself() -> None:
    wins = 0
    for seed in range(100):
        base = TimedChild("baseline", 1.0, 0.0, seed)
        cand = TransientChild("candidate", 0.94, 0.04, 300 + seed, fast=MIN_ROUNDS)
        fb = step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR)  # type: ignore[arg-type]
        assert step_look(fb.details["log_ratios"]["total"][:MIN_ROUNDS], STEP_MIN_FLOOR, least=MIN_ROUNDS) == "win"
        wins += fb.verdict == "pass"
    assert wins <= 3  # a win now needs the blocks after the transient to lean the same way (2 of 200 seeds did)


def test_the_step_floor_is_the_bias_the_aa_shows_and_at_least_the_minimum() -> None:
    tight = block_estimate([0.001, -0.002, 0.0015, -0.001, 0.0005, 0.0, 0.001, -0.0005])
    assert aa_floor(tight, STEP_MIN_FLOOR) == STEP_MIN_FLOOR
    wide = block_estimate([-0.08, -0.02, -0.06, -0.01, -0.07, -0.03, -0.05, -0.04])
    floor = aa_floor(wide, STEP_MIN_FLOOR)
    assert floor == pytest.approx(-math.log(wide.lo)) and floor > STEP_MIN_FLOOR
    assert aa_floor(block_estimate([0.01]), STEP_MIN_FLOOR) == math.inf
    noisy = block_estimate([0.09, -0.07, 0.05, -0.08, 0.06, -0.04, 0.02, -0.01])  # contains 1: noise, no bias shown
    assert noisy.lo < 1 < noisy.hi and -math.log(noisy.lo) > 0.04
    assert aa_floor(noisy, STEP_MIN_FLOOR) == STEP_MIN_FLOOR  # its noise is in the candidate's own interval already
    offset = block_estimate([0.12, -0.04, 0.10, -0.03, 0.09, -0.05, 0.11, 0.02])  # contains 1, a centre ~4% off
    assert offset.lo < 1 < offset.hi and aa_floor(offset, STEP_MIN_FLOOR) == STEP_MIN_FLOOR  # that centre is noise


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
    assert narrow.numbers["aa_ratio"].n == MAX_ROUNDS and len(twin.siblings) == MAX_ROUNDS


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


def test_children_with_speeds_of_their_own_give_an_aa_interval_that_contains_one() -> None:
    """Each child 3% faster or slower than the next (sd), persistently, as measured here: over fresh pairs the
    A/A interval contains 1 at its confidence (rounds on one pair would measure that pair's offset)."""
    contains = 0
    for seed in range(200):
        base, twin = (TimedChild(n, 1.0, 0.02, seed * 2 + i, own_sd=0.03) for i, n in enumerate(("baseline", "twin")))
        aa = step_floor(base, twin, UNIT, margin=-1.0)  # type: ignore[arg-type]  # never settled: all blocks
        contains += aa.numbers["aa_ratio"].ci_low <= 1.0 <= aa.numbers["aa_ratio"].ci_high
    assert contains >= 192  # a 99% interval (the decisions'): 198 expected


def test_an_aa_that_stops_early_returns_the_floor_its_stop_rule_saw() -> None:
    """The A/A stops once its floor lies below the win's margin; the floor it returns must be that one (it
    was read at 95% after a stop at 99%, and a 4-block A/A's chance exclusion of 1 refused a real fix)."""
    for seed in range(60):
        base, twin = (TimedChild(n, 1.0, 0.03, seed * 2 + i, own_sd=0.03) for i, n in enumerate(("baseline", "twin")))
        aa = step_floor(base, twin, UNIT, margin=0.06)  # type: ignore[arg-type]
        if aa.numbers["aa_ratio"].n < MAX_ROUNDS:
            assert aa.numbers["aa_floor"].value < 0.06, aa.finding


def test_a_ten_percent_win_over_children_of_their_own_speeds_is_found() -> None:
    found = 0
    for seed in range(50):
        base = TimedChild("baseline", 1.0, 0.03, seed, own_sd=0.03)
        cand = TimedChild("candidate", 0.9, 0.03, 500 + seed, own_sd=0.03)
        found += step_bench(base, cand, UNIT, floor=STEP_MIN_FLOOR).verdict == "pass"  # type: ignore[arg-type]
    assert found >= 40, found


def test_the_trimmed_estimate_is_the_t_interval_without_a_cut_and_shrugs_off_wild_blocks() -> None:
    calm = [-0.09, -0.11, -0.08, -0.10, -0.12, -0.07, -0.10, -0.09, -0.11, -0.08]
    plain, yuen = block_estimate(calm, 0.99), block_estimate(calm[:4], 0.99, 0.2)
    assert yuen.lo == pytest.approx(block_estimate(calm[:4], 0.99).lo) and yuen.df == 3  # 0.2 x 4 blocks: none cut
    wild = calm[:8] + [0.25, -0.40]  # two pairs far off, one each way
    t_wild, y_wild = block_estimate(wild, 0.99), block_estimate(wild, 0.99, 0.2)
    assert y_wild.df == 5 and y_wild.trim == 0.2  # 2 cut from each end of 10
    assert abs(math.log(y_wild.ratio) - math.log(plain.ratio)) < 0.01  # the centre stays where the bulk is
    assert y_wild.half_width < t_wild.half_width / 2 and y_wild.hi < math.exp(-STEP_MIN_FLOOR) < t_wild.hi
