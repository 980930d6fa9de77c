"""Input cases for probes: an inputs factory maps (trial, generator) to one Case of arguments."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass
class Case:
    """Arguments for one call, with a label for reports and the reduction length when there is one."""

    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""
    reduction: int | None = None  # length of the summed axis (K of a matmul), for error-growth reports


InputsFactory = Callable[[int, torch.Generator], Any]


def draw(factory: InputsFactory, trial: int, seed: int = 0) -> Case:
    """Call the factory with a fresh generator for this trial and normalize what it returns into a Case."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + trial)
    made = factory(trial, generator)
    if isinstance(made, Case):
        return made
    if isinstance(made, dict):
        return Case(kwargs=made)
    if isinstance(made, tuple):
        return Case(args=made)
    if isinstance(made, list):
        return Case(args=tuple(made))
    return Case(args=(made,))


def call(fn: Callable[..., Any], case: Case) -> Any:
    """Apply fn to a case's arguments."""
    return fn(*case.args, **case.kwargs)


def tensors_of(value: Any) -> list[torch.Tensor]:
    """Every tensor inside a (possibly nested) tuple/list/dict, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors_of(v)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors_of(v)]
    return []
