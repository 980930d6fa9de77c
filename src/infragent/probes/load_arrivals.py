"""When loadgen sends: all at once, a constant rate, Poisson, or gamma arrivals with a burstiness factor."""
from __future__ import annotations

import math

import numpy as np

ARRIVALS = ("burst", "constant", "poisson", "gamma")


def arrival_times(n: int, rate: float, burstiness: float = 1.0, process: str = "gamma",
                  seed: int = 0) -> list[float]:
    """Send offsets (seconds) of n requests. rate=inf sends all at once.

    Gamma inter-arrival times have shape = burstiness and mean 1/rate (vLLM's definition): burstiness 1 is a
    Poisson process, below 1 is burstier, above 1 more regular; "constant" spaces requests exactly 1/rate.
    """
    if n <= 0:
        return []
    if math.isinf(rate) or process == "burst":
        return [0.0] * n
    if rate <= 0:
        raise ValueError(f"--request-rate {rate}: must be > 0 (or inf for all at once)")
    if process == "constant":
        return [i / rate for i in range(n)]
    if process == "poisson":
        burstiness = 1.0
    elif process != "gamma":
        raise ValueError(f"arrival process {process!r}: choose one of {', '.join(ARRIVALS)}")
    if burstiness <= 0:
        raise ValueError(f"--burstiness {burstiness}: must be > 0")
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n)
    gaps[0] = 0.0  # the first request goes at once
    return np.cumsum(gaps).tolist()
