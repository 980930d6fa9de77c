"""Input cases for probes: an inputs factory maps (trial, generator) to one Case of arguments.

A factory written another way is adapted, not guessed at: inputs_style "seed" calls it as factory(seed),
one integer per trial; a factory whose signature fits neither is refused before any call, with the fix.
"""
from __future__ import annotations

import inspect
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
INPUT_STYLES = ("trial", "seed")


class InputsError(ValueError):
    """An inputs factory infragent cannot call as asked; the message says how to fix it."""


def inputs_factory(fn: Callable[..., Any], style: str = "trial", name: str = "inputs") -> InputsFactory:
    """fn as an inputs factory: style "trial" calls fn(trial, generator) (a torch.Generator to draw tensors
    from), style "seed" calls fn(seed) with one integer seed per trial."""
    if style not in INPUT_STYLES:
        raise InputsError(f"inputs_style {style!r}: use 'trial' (factory(trial, generator)) or 'seed' "
                          "(factory(seed))")
    takes = _parameters(fn)
    if style == "trial":
        if takes is not None and (not _accepts(fn, 2) or _seeded(fn)):
            raise InputsError(f"{name}: your factory takes ({takes}); infragent calls factory(trial, generator) "
                              "(trial: an int, generator: a seeded torch.Generator): wrap it, or pass "
                              "inputs_style='seed' (--inputs-style seed) to have it called as factory(seed)")
        return fn
    if takes is not None and not _accepts(fn, 1):
        raise InputsError(f"{name}: inputs_style 'seed' calls factory(seed), but your factory takes ({takes}): "
                          "give its other parameters defaults, or wrap it")
    return lambda trial, generator: fn(trial)


def _parameters(fn: Callable[..., Any]) -> str | None:
    try:
        return ", ".join(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature: call it and see
        return None


def _seeded(fn: Callable[..., Any]) -> bool:
    """Whether the signature says seed-style (seed, sizes...): a first parameter named seed, or a second one
    that takes a number (an int annotation or default) where a generator belongs."""
    params = list(inspect.signature(fn).parameters.values())
    if params and params[0].name == "seed":
        return True
    if len(params) < 2 or params[1].kind in (params[1].VAR_POSITIONAL, params[1].VAR_KEYWORD):
        return False
    second = params[1]
    numeric_default = isinstance(second.default, (int, float)) and not isinstance(second.default, bool)
    return numeric_default or second.annotation in (int, "int", float, "float")


def _accepts(fn: Callable[..., Any], count: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(count))
    except TypeError:
        return False
    return True


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
