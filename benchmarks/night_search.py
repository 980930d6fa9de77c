"""A night's search on N nodes, simulated from a real run: how many trials per hour 1, 8 and 64 nodes give, and
where the driver or the ledger would saturate first.

Inputs, all measured:
  * trial times: the durations of a real optimize run's trials, read from its ledger (a Ray run's
    started/finished clock per trial, else the gaps between a local run's candidate records);
  * records and artifact bytes per trial: the same run's ledger;
  * the driver's work per trial: the search proposer's ask + tell timed here at the history sizes a night
    reaches (TPE's ask grows with the trials it has seen), plus landing the trial's records in the ledger at
    the append rate given (--append-rate; benchmarks/ledger_append_rate.py measures it: PostgreSQL, 1 writer,
    since one driver lands every bundle);
  * the proposer's parallel efficiency: async TPE with N trials pending (constant liar) against one at a time,
    on a synthetic objective over the run's own knob space (a smooth bowl around a random optimum, 2% noise):
    the trials needed to get within --within (1%) of the optimum, median over --replicates seeds; efficiency =
    trials(1) / trials(N), with a bootstrap CI over the seeds.

The simulation: N nodes each run one trial at a time, trial times drawn from the run's (bootstrap); the driver
is one server that proposes before each start and lands each finished trial, first come first served. A
night is --hours long. Prints trials/hour, driver utilisation, useful trials/hour (times the efficiency), and
the node counts at which the driver and the ledger would be busy all the time.

    PYTHONPATH=src .venv/bin/python benchmarks/night_search.py --ledger L --run N [--append-rate 638] [--json out]
"""
from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import time
from pathlib import Path

import optuna

from infragent.agent.proposers.search import SearchProposer
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Knob, load_spec

NODES = (1, 8, 64)
HISTORY_SIZES = (10, 100, 300, 1000)


def trial_times(ledger: Ledger, run: int) -> list[float]:
    """Seconds per trial: the node's clock for a Ray run, else the gaps between candidate records."""
    candidates = ledger.candidates(run)
    timed = [c["finished_at"] - c["started_at"] for c in candidates if c.get("started_at")]
    if timed:
        return timed
    stamps = [r[0] for r in ledger.db.execute("SELECT created FROM candidates WHERE run_id = ? ORDER BY created",
                                              (run,)).fetchall()]
    return [b - a for a, b in zip(stamps, stamps[1:])]


def records_per_trial(ledger: Ledger, run: int) -> float:
    """Probe records a trial writes, on average."""
    trials = max(1, len(ledger.candidates(run)))
    keys = [r["key"] for r in ledger.probe_results(run) if r["key"].startswith("trial/")]
    return len(keys) / trials


def ask_tell_seconds(knobs: dict[str, Knob], history: int, samples: int = 20) -> float:
    """The search proposer's ask + tell at a given history size (median seconds)."""
    search = SearchProposer(knobs, seed=0, parallel=True)
    rng = random.Random(0)
    for _ in range(history):
        number, _ = search.ask()
        search.tell_objective(number, rng.random(), True)
    times = []
    for _ in range(samples):
        begun = time.perf_counter()
        number, _ = search.ask()
        search.tell_objective(number, rng.random(), True)
        times.append(time.perf_counter() - begun)
    return statistics.median(times)


def driver_seconds(sizes: dict[int, float], history: int) -> float:
    """ask + tell at this history size, interpolated in the measured points (linear beyond the last)."""
    points = sorted(sizes.items())
    for (h0, s0), (h1, s1) in zip(points, points[1:]):
        if history <= h1:
            return s0 + (s1 - s0) * max(0, history - h0) / (h1 - h0)
    (h0, s0), (h1, s1) = points[-2], points[-1]
    return s1 + (s1 - s0) * (history - h1) / (h1 - h0)


def simulate(nodes: int, durations: list[float], ask_s: dict[int, float], land_s: float, hours: float,
             seed: int) -> dict[str, float]:
    """One night: trials finished, driver busy time."""
    rng = random.Random(seed)
    end, driver_free, busy, finished = hours * 3600, 0.0, 0.0, 0
    events = [(0.0, "free", n) for n in range(nodes)]  # (time, what, node)
    heapq.heapify(events)
    while events:
        now, what, node = heapq.heappop(events)
        if now > end:
            break
        start = max(now, driver_free)
        if what == "done":  # the driver lands the trial, then the node is free
            driver_free = start + land_s
            busy += land_s
            finished += 1
            heapq.heappush(events, (driver_free, "free", node))
            continue
        work = driver_seconds(ask_s, finished)
        driver_free = start + work
        busy += work
        heapq.heappush(events, (driver_free + rng.choice(durations), "done", node))
    return {"trials_per_hour": finished / hours, "driver_utilisation": min(1.0, busy / end)}


def _bowl(knobs: dict[str, Knob], rng: random.Random):  # noqa: ANN202
    """A smooth objective over the knobs' domains, 1.0 at a random configuration the knobs can take."""
    def scaled(name: str, value: float) -> float:
        knob = knobs[name]
        if knob.type in ("int", "float"):
            low, high = (float(x) for x in knob.domain)
            if knob.type == "int" and high / max(low, 1) >= 16:
                return (math.log(value) - math.log(low)) / (math.log(high) - math.log(low))
            return (value - low) / (high - low) if high > low else 0.0
        values = [False, True] if knob.type == "bool" else list(knob.domain)
        return values.index(value) / max(1, len(values) - 1)

    def reachable(name: str) -> float:
        knob = knobs[name]
        if knob.type == "int":
            return scaled(name, rng.randint(*(int(x) for x in knob.domain)))
        if knob.type == "float":
            low, high = (float(x) for x in knob.domain)
            return scaled(name, rng.uniform(low, high))
        return scaled(name, rng.choice([False, True] if knob.type == "bool" else list(knob.domain)))

    optimum = {n: reachable(n) for n in knobs}

    def objective(values: dict) -> float:
        return 1.0 - sum((scaled(n, values[n]) - optimum[n]) ** 2 for n in knobs) / len(knobs)
    return objective


def trials_to_target(knobs: dict[str, Knob], pending: int, seed: int, within: float, limit: int = 400) -> int:
    """Trials async TPE needs, with `pending` trials in flight, to get within `within` of the optimum."""
    rng = random.Random(seed)
    objective = _bowl(knobs, rng)
    search = SearchProposer(knobs, seed=seed, parallel=pending > 1)
    flying = [search.ask() for _ in range(pending)]
    for count in range(1, limit + 1):
        number, values = flying.pop(rng.randrange(len(flying)))  # trials finish in any order
        score = objective(values)
        if score >= 1.0 - within:
            return count
        search.tell_objective(number, score + rng.gauss(0, 0.02), True)
        flying.append(search.ask())
    return limit


def efficiency_ci(alone: list[int], parallel: list[int], resamples: int = 2000,
                  level: float = 0.95) -> tuple[float, float, float]:
    """Median trials alone / median trials in parallel, with a bootstrap percentile CI over the replicates."""
    rng = random.Random(0)
    point = statistics.median(alone) / statistics.median(parallel)
    ratios = sorted(statistics.median(rng.choices(alone, k=len(alone)))
                    / statistics.median(rng.choices(parallel, k=len(parallel))) for _ in range(resamples))
    tail = (1 - level) / 2
    return point, ratios[int(tail * resamples)], ratios[int((1 - tail) * resamples) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ledger", required=True)
    parser.add_argument("--run", type=int, required=True)
    parser.add_argument("--append-rate", type=float, default=638.0, help="ledger records/s (PostgreSQL, 1 writer)")
    parser.add_argument("--hours", type=float, default=8.0)
    parser.add_argument("--replicates", type=int, default=20)
    parser.add_argument("--within", type=float, default=0.01, help="target: this close to the optimum's objective")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    ledger = Ledger.existing(args.ledger, readonly=True)
    durations = trial_times(ledger, args.run)
    records = records_per_trial(ledger, args.run)
    knobs = load_spec(ledger.run(args.run)["spec_path"]).knobs
    land_s = records / args.append_rate
    ask_s = {h: ask_tell_seconds(knobs, h) for h in HISTORY_SIZES}
    print(f"run {args.run}: {len(durations)} trials, median {statistics.median(durations):.1f} s "
          f"(min {min(durations):.1f}, max {max(durations):.1f}); {records:.1f} records per trial")
    print("driver per trial: ask+tell " + ", ".join(f"{s * 1000:.1f} ms at {h}" for h, s in ask_s.items())
          + f"; landing {land_s * 1000:.1f} ms ({args.append_rate:g} records/s)")
    needed = {n: [trials_to_target(knobs, n, seed, args.within) for seed in range(args.replicates)] for n in NODES}
    rows = []
    for n in NODES:
        night = simulate(n, durations, ask_s, land_s, args.hours, seed=n)
        efficiency, low, high = efficiency_ci(needed[1], needed[n])
        to_target_s = max(min(durations), statistics.median(needed[n]) / night["trials_per_hour"] * 3600)
        rows.append({"nodes": n, **night, "trials_to_target": needed[n], "parallel_efficiency": efficiency,
                     "parallel_efficiency_ci": [low, high], "minutes_to_target": to_target_s / 60,
                     "useful_trials_per_hour": night["trials_per_hour"] * min(1.0, efficiency)})
        print(f"{n:3d} nodes: {night['trials_per_hour']:8.1f} trials/h, driver busy {night['driver_utilisation']:.1%},"
              f" trials to within {args.within:.0%} of the optimum {statistics.median(needed[n]):.0f}"
              f" (efficiency {efficiency:.2f} [{low:.2f}, {high:.2f}]; about {to_target_s / 60:.0f} min),"
              f" useful {rows[-1]['useful_trials_per_hour']:.1f} trials/h")
    mean_trial = statistics.mean(durations)
    late_ask = driver_seconds(ask_s, int(rows[-1]["trials_per_hour"] * args.hours))
    driver_nodes = mean_trial / (late_ask + land_s)
    ledger_nodes = args.append_rate * mean_trial / records
    print(f"saturation: the driver is busy all the time at about {driver_nodes:.0f} nodes (ask+tell at a night's "
          f"history {late_ask * 1000:.0f} ms + landing); the ledger at about {ledger_nodes:.0f} nodes "
          f"({args.append_rate:g} records/s / {records:.1f} records per {mean_trial:.0f}-s trial)")
    if args.json:
        args.json.write_text(json.dumps({"durations": durations, "records_per_trial": records, "ask_s": ask_s,
                                         "land_s": land_s, "rows": rows, "driver_saturates_at_nodes": driver_nodes,
                                         "ledger_saturates_at_nodes": ledger_nodes}, indent=1))


if __name__ == "__main__":
    main()
