"""SmoothQuant: per input channel j, s_j = max|X_j|^α / max|W_j|^(1-α), from activation ranges seen on
calibration text; W8A8Linear then quantizes W·diag(s) and diag(s)⁻¹·x."""
from __future__ import annotations

import torch

CLAMP = 1e-5  # channels that never fire (or all-zero weight rows) get a finite factor


class InputRange:
    """Wraps a linear and keeps the largest |x| seen per input channel."""

    def __init__(self, linear) -> None:
        self.linear = linear
        self.amax: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        seen = x.detach().abs().amax(dim=0).float()
        self.amax = seen if self.amax is None else torch.maximum(self.amax, seen)
        return self.linear(x)


def input_ranges(model, run_calibration) -> list[torch.Tensor]:
    """Per projection of model (in model.projections() order), max |x| per input channel while
    run_calibration() runs; the projections are restored afterwards."""
    sites = model.projections()
    recorders = [InputRange(getattr(owner, name)) for owner, name in sites]
    for (owner, name), recorder in zip(sites, recorders):
        setattr(owner, name, recorder)
    try:
        run_calibration()
    finally:
        for (owner, name), recorder in zip(sites, recorders):
            setattr(owner, name, recorder.linear)
    missing = [i for i, r in enumerate(recorders) if r.amax is None]
    if missing:
        raise RuntimeError(f"SmoothQuant calibration: projections {missing} saw no input; calibrate on longer text")
    return [r.amax for r in recorders]  # type: ignore[misc]


def smoothing_factors(act_amax: torch.Tensor, weight_t: torch.Tensor, alpha: float) -> torch.Tensor:
    """s per input channel of a [in, out] weight, migrating a share α of the activation range to the weight."""
    weight_amax = weight_t.abs().amax(dim=1).float()
    return act_amax.clamp_min(CLAMP).pow(alpha) / weight_amax.clamp_min(CLAMP).pow(1.0 - alpha)
