"""Guards against results that cannot be trusted: inputs mutated, outputs aliased, cached or constant."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from infragent.probes.output_diff import diff_outputs, output_tensors
from infragent.probes.inputs import Case, InputsFactory, call, draw, tensors_of


@dataclass
class GuardHit:
    """A guard that fired: its name, a one-line finding, and where."""

    guard: str
    finding: str
    trial: int
    label: str
    where: dict[str, Any] = field(default_factory=dict)


def clone_value(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, Case):
        return Case(clone_value(value.args), clone_value(value.kwargs), value.label, value.reduction)
    if isinstance(value, dict):
        return {k: clone_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(clone_value(v) for v in value)
    return value


def _identical(a: Any, b: Any) -> bool:
    """Same tensors bit for bit (NaN equals NaN)."""
    ta, tb = output_tensors(a), output_tensors(b)
    if len(ta) != len(tb):
        return False
    for x, y in zip(ta, tb):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        same = x == y
        if x.is_floating_point() or x.is_complex():
            same = same | (x.isnan() & y.isnan())
        if not bool(same.all()):
            return False
    return True


def _named_tensors(case: Case, params: list[str]) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every input tensor: 'arg 0 (x)', 'arg 1[2]', "kwarg 'q'"."""
    named = []
    for i, arg in enumerate(case.args):
        base = f"arg {i}" + (f" ({params[i]})" if i < len(params) else "")
        tensors = tensors_of(arg)
        named += [(base if isinstance(arg, torch.Tensor) else f"{base}[{j}]", t) for j, t in enumerate(tensors)]
    for key, value in case.kwargs.items():
        named += [(f"kwarg {key!r}", t) for t in tensors_of(value)]
    return named


def param_names(fn: Callable[..., Any]) -> list[str]:
    try:
        return [p.name for p in inspect.signature(fn).parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return []


def mutated_argument(before: Case, after: Case, params: list[str]) -> str | None:
    """The first input whose values changed during the call, by name."""
    for (name, old), (_, new) in zip(_named_tensors(before, params), _named_tensors(after, params)):
        if not _identical(old, new):
            return name
    return None


def _storage(t: torch.Tensor) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


def aliased_output(outputs: Any, case: Case, params: list[str]) -> str | None:
    """The first input whose storage overlaps an output's storage, by name."""
    for out in tensors_of(outputs):
        if out.numel() == 0:
            continue
        lo, hi = _storage(out)
        for name, t in _named_tensors(case, params):
            if t.numel() and t.device == out.device:
                t_lo, t_hi = _storage(t)
                if lo < t_hi and t_lo < hi:
                    return name
    return None


def dependence_guard(candidate: Callable[..., Any], reference: Callable[..., Any], factory: InputsFactory,
                      seed: int, rtol: float | None) -> list[GuardHit]:
    """Constant output, output caching (first call, or keyed by tensor identity) and output-buffer reuse.

    Runs before any other call to the candidate: inputs A then B (same shapes, new values), then A's
    tensors refilled in place with B's values. A memoized candidate gives A's output for B although
    it was right for A; a constant one gives the same wrong output for both; an identity-keyed cache
    gives A's output for the refilled tensors. Skipped when the reference gives equal outputs for A and B.
    """
    a, b = draw(factory, 0, seed), draw(factory, 0, seed + 1)
    shapes = [tuple(t.shape) for t in tensors_of((a.args, a.kwargs))]
    if shapes != [tuple(t.shape) for t in tensors_of((b.args, b.kwargs))]:
        return []
    try:
        ref_a, ref_b = call(reference, clone_value(a)), call(reference, clone_value(b))
    except Exception:
        return []
    if _identical(ref_a, ref_b):
        return []
    b_values = clone_value(b)
    try:
        live_a = call(candidate, a)
        out_a = clone_value(live_a)
        out_b = clone_value(call(candidate, b))
    except Exception:
        return []  # the main loop reports the exception
    label = a.label or "trial 0"
    if _identical(out_a, out_b):
        if diff_outputs(out_a, ref_a, a.reduction, rtol).ok:
            return [GuardHit("output_caching", "candidate caches its output: a second call with new inputs "
                             "returned the first call's result", 0, label, {"calls": "first, second"})]
        return [GuardHit("constant_output", "candidate output does not depend on its inputs: "
                         "same output for different inputs", 0, label)]
    hits = []
    if not _identical(live_a, out_a):
        hits.append(GuardHit("output_reuse", "candidate reuses its output buffer: a later call "
                             "overwrote the tensor an earlier call returned", 0, label))
    for dst, src in zip(tensors_of((a.args, a.kwargs)), tensors_of((b_values.args, b_values.kwargs))):
        dst.copy_(src)
    try:
        out_refilled = clone_value(call(candidate, a))
    except Exception:
        return hits
    if _identical(out_refilled, out_a):
        hits.append(GuardHit("output_caching", "candidate caches its output by tensor identity (id/data_ptr): "
                             "the same tensors refilled with new values gave the old result", 0, label,
                             {"calls": "same tensor objects, new values"}))
    return hits
