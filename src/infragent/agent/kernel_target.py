"""A kernel target's code, loaded from a folder: the candidate (with knob values bound as keyword
arguments), the reference, the inputs factories and the optional threaded workload.

Files load by path under a module name unique to their folder, so the baseline's folder and a candidate's
worktree can be loaded side by side in one process (the benchmark interleaves them). A pack's files import
from infragent and torch, not from each other.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from infragent.lab.spec import Target


class KernelTargetError(ValueError):
    """A kernel target whose code cannot be loaded; the message names the file and function."""


@dataclass
class KernelTarget:
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
    module = _load_module(root / file, what)
    target: Any = module
    for part in name.split("."):
        if not hasattr(target, part):
            raise KernelTargetError(f"{root / file}: {what} {ref!r}: no attribute {part!r}")
        target = getattr(target, part)
    if not callable(target):
        raise KernelTargetError(f"{root / file}: {what} {ref!r} is not callable")
    return target


def _load_module(path: Path, what: str) -> ModuleType:
    path = path.resolve()
    key = "infragent_code_" + hashlib.sha1(str(path).encode()).hexdigest()[:12] + "_" + path.stem
    if key in sys.modules:
        return sys.modules[key]
    if not path.is_file():
        raise KernelTargetError(f"{path}: {what}: no such file")
    spec = importlib.util.spec_from_file_location(key, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[key]
        raise KernelTargetError(f"{path}: {what}: importing it raised {type(err).__name__}: {err}") from err
    return module


def load_kernel_target(target: Target, root: Path, knobs: dict[str, Any]) -> KernelTarget:
    """Load a kernel target's callables from root (the spec's folder or a worktree's copy of it)."""
    assert target.candidate and target.reference and target.inputs
    candidate = load_function(root, target.candidate, "candidate")
    params = inspect.signature(candidate).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for name in knobs:
        if name not in params and not takes_any:
            raise KernelTargetError(f"{root / target.candidate.partition(':')[0]}: knob {name!r} is not a keyword "
                                    f"argument of {target.candidate}; its parameters: {', '.join(params)}")
    inputs = load_function(root, target.inputs, "inputs")
    return KernelTarget(
        root=root, candidate=candidate, reference=load_function(root, target.reference, "reference"),
        inputs=inputs,
        bench_inputs=load_function(root, target.bench_inputs, "bench_inputs") if target.bench_inputs else inputs,
        workload=load_function(root, target.workload, "workload") if target.workload else None, target=target)
