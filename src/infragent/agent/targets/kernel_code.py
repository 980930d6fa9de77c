"""A kernel target's code, loaded from a folder: the candidate (with knob values bound as keyword
arguments), the reference, the inputs factories and the optional threaded workload.

Files load by path (probes/callables.from_file), so the baseline's folder and a candidate's worktree load
side by side in one process (the benchmark interleaves them). A pack's files import from infragent and
torch, not from each other.
"""
from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from infragent.lab.spec import Target
from infragent.probes.callables import CallableError, from_file


class KernelCodeError(ValueError):
    """A kernel target whose code cannot be loaded; the message names the file and function."""


@dataclass
class KernelCode:
    """The callables of one copy of a kernel target's code."""

    root: Path
    candidate: Callable[..., Any]
    reference: Callable[..., Any]
    inputs: Callable[..., Any]
    bench_inputs: Callable[..., Any]
    workload: Callable[..., Any] | None
    target: Target

    def bind(self, knobs: dict[str, Any]) -> Callable[..., Any]:
        """The candidate with these knob values as keyword arguments (named after the candidate)."""
        bound = functools.partial(self.candidate, **knobs)
        functools.update_wrapper(bound, self.candidate)
        return bound

    def bound_workload(self, knobs: dict[str, Any]) -> Callable[[], Any]:
        """The workload with the knobs it accepts bound."""
        assert self.workload is not None
        accepted = inspect.signature(self.workload).parameters
        return functools.partial(self.workload, **{k: v for k, v in knobs.items() if k in accepted})


def load_function(root: Path, ref: str, what: str) -> Callable[..., Any]:
    """'FILE.py:function' under root, loaded by path."""
    file, _, name = ref.partition(":")
    try:
        return from_file(root / file, name, what)
    except CallableError as err:
        raise KernelCodeError(str(err)) from err


def load_kernel_code(target: Target, root: Path, knobs: dict[str, Any]) -> KernelCode:
    """Load a kernel target's callables from root (the spec's folder or a worktree's copy of it)."""
    assert target.candidate and target.reference and target.inputs
    candidate = load_function(root, target.candidate, "candidate")
    params = inspect.signature(candidate).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in knobs:
        if name not in params and not takes_any:
            raise KernelCodeError(f"{root / target.candidate.partition(':')[0]}: knob {name!r} is not a keyword "
                                    f"argument of {target.candidate}; its parameters: {', '.join(params)}")
    inputs = load_function(root, target.inputs, "inputs")
    return KernelCode(
        root=root, candidate=candidate, reference=load_function(root, target.reference, "reference"),
        inputs=inputs,
        bench_inputs=load_function(root, target.bench_inputs, "bench_inputs") if target.bench_inputs else inputs,
        workload=load_function(root, target.workload, "workload") if target.workload else None, target=target)
