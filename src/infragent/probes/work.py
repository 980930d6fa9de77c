"""Work counts of one call: FLOP/byte formulas for our own kernels, and a counter that runs the call once.

Conventions (the formulas and the counter share them, and a test holds them equal on kda_decode_step):
- matmul-like ops: 2*M*K*N, from torch.utils.flop_counter (FlopCounterMode and its formula registry);
- pointwise arithmetic (add, mul, exp, rsqrt, compare, ...): 1 FLOP per output element;
- reductions (sum, amax, mean, ...): 1 FLOP per input element;
- data movement (copy, cat, stack, pad, clone, fill, views): 0 FLOPs.
Bytes are a lower bound: every input read once, every output and every mutated input written once.
"""
from __future__ import annotations

import inspect
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from infragent.engine.models.kda_ops import kda_decode_step
from infragent.probes.inputs import Case, call, tensors_of
from infragent.probes.op_roles import SYNC_OPS, fused, role


@dataclass
class WorkCount:
    """FLOPs and bytes of one call, and where the numbers came from."""

    flops: float
    bytes: float  # lower bound (inputs read once, outputs and mutated inputs written once), or the formula's
    source: str  # "formula:<name>", "counted" or "given"
    ops: int = 0  # torch kernels dispatched by the call (views excluded); 0 when not counted
    op_bytes: float = 0.0  # upper bound: every op's operands read and results written through memory
    parts: dict[str, float] = field(default_factory=dict)  # counted FLOPs by kind
    uncounted_ops: dict[str, int] = field(default_factory=dict)  # ops with no FLOP rule (counted as 0)
    by_op: dict[str, tuple[int, float]] = field(default_factory=dict)  # op name -> (calls, FLOPs); when counted
    shapes: dict[str, list[list[list[int]]]] = field(default_factory=dict)  # op name -> its operands' shapes
    # (the first MAX_SHAPES distinct ones): what tells a padded dimension apart
    by_role: dict[str, tuple[int, float]] = field(default_factory=dict)  # op_roles.role -> (calls, FLOPs), fused
    # ops expanded into the roles of their decomposition: what redundancy pairs across two kernels
    role_shapes: dict[str, list[list[list[int]]]] = field(default_factory=dict)  # role -> its ops' operand shapes
    role_ops: dict[str, list[str]] = field(default_factory=dict)  # role -> the op names that did it
    syncs: int = 0  # ops after which the host waits for a result (.item(), .tolist(), nonzero, a copy to the CPU)


# ---- formulas ---------------------------------------------------------------------------------------------

def matmul_flops(m: int, k: int, n: int) -> int:
    """FLOPs of an [m, k] @ [k, n] matmul (one multiply and one add per term)."""
    return 2 * m * k * n


def kda_decode_step_flop_terms(B: int, H: int, dk: int, dv: int) -> dict[str, int]:
    """FLOPs of each operation of kda_decode_step, read off its code line by line."""
    BH = B * H
    return {
        "qk_sq_norms": 2 * BH * 2 * dk,  # vecdot(qk, qk): mul + sum over dk, for q and k
        "norm_eps_rsqrt": 2 * BH * 2,  # + eps, rsqrt, for q and k
        "qk_scale": BH * 2 * dk,  # qk *= rsqrt
        "gate_exp": BH * dk,  # exp(g)
        "state_decay": BH * dk * dv,  # state *= exp(g)
        "kT_S": 2 * BH * dk * dv,  # u = k^T S
        "v_minus_u_beta": 2 * BH * dv,  # u = (v - u) * beta
        "rank1_update": 2 * BH * dk * dv,  # S += k u^T
        "qT_S": 2 * BH * dk * dv,  # o = q^T S
        "out_scale": BH * dv,  # o *= scale
    }


def kda_decode_step_flops(B: int, H: int, dk: int, dv: int) -> int:
    """FLOPs of kda_decode_step: B*H*(7*dk*dv + 3*dv + 7*dk + 4)."""
    return sum(kda_decode_step_flop_terms(B, H, dk, dv).values())


def kda_decode_step_bytes(B: int, H: int, dk: int, dv: int, itemsize: int = 4) -> int:
    """Least bytes kda_decode_step moves: q, k, g, v, beta and o once, the fp32 state read and written once."""
    BH = B * H
    return itemsize * (3 * BH * dk + 2 * BH * dv + BH) + 2 * 4 * BH * dk * dv


# ---- registry: formulas keyed by function -------------------------------------------------------------------

Formula = Callable[[Case], tuple[float, float]]  # case -> (flops, bytes)
_FORMULAS: dict[Callable[..., Any], tuple[str, Formula]] = {}


def register_formula(fn: Callable[..., Any], formula: Formula, name: str | None = None) -> None:
    """Use formula(case) -> (flops, bytes) instead of counting whenever fn is measured."""
    _FORMULAS[fn] = (name or getattr(fn, "__name__", repr(fn)), formula)


def formula_for(fn: Callable[..., Any]) -> tuple[str, Formula] | None:
    """The (name, formula) registered for fn (or for the function it wraps), if any."""
    while fn is not None:
        if fn in _FORMULAS:
            return _FORMULAS[fn]
        fn = getattr(fn, "__wrapped__", None)
    return None


def _kda_decode_step_case(case: Case) -> tuple[float, float]:
    bound = inspect.signature(kda_decode_step).bind(*case.args, **case.kwargs)
    k, v = bound.arguments["k"], bound.arguments["v"]
    B, H, dk = k.shape
    dv = v.shape[-1]
    return float(kda_decode_step_flops(B, H, dk, dv)), float(kda_decode_step_bytes(B, H, dk, dv, v.element_size()))


register_formula(kda_decode_step, _kda_decode_step_case)


# ---- the counter ---------------------------------------------------------------------------------------------

# Ops that move or create data without arithmetic (some carry the pointwise tag, e.g. clone, where).
_DATA_MOVEMENT = frozenset("""
    stack cat copy _copy_from clone _to_copy constant_pad_nd fill zero zeros ones empty empty_like zeros_like
    ones_like full full_like new_empty new_zeros new_ones new_full empty_strided index index_select gather
    scatter index_put index_copy slice_scatter select_scatter as_strided_scatter masked_fill where repeat
    expand_copy permute_copy contiguous lift_fresh lift_fresh_copy flip roll tril triu arange detach alias
    set resize narrow_copy t_copy transpose_copy view_copy split_with_sizes_copy embedding _unsafe_view
    randn rand normal uniform bernoulli random randint randperm _local_scalar_dense
""".split())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _base_name(func: Any) -> str:
    name = func._opname
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


MAX_SHAPES = 4


class _OpCounter(TorchDispatchMode):
    """Counts what FlopCounterMode leaves out: pointwise and reduction FLOPs, in-place matmuls, ops and bytes."""

    def __init__(self, matmul_registry: dict[Any, Any], timeline: list | None = None) -> None:
        super().__init__()
        self.registry = matmul_registry
        self.timeline = timeline  # when a list: (perf_counter_ns, op, FLOPs, output dtype) per op, for spans
        self.parts: Counter[str] = Counter()
        self.uncounted: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.op_flops: Counter[str] = Counter()
        self.ops = 0
        self.op_bytes = 0
        self.shapes: dict[str, list[list[list[int]]]] = {}
        self.role_calls: Counter[str] = Counter()
        self.role_flops: Counter[str] = Counter()
        self.role_shapes: dict[str, list[list[list[int]]]] = {}
        self.role_ops: dict[str, list[str]] = {}
        self.syncs = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.is_view or torch.Tag.inplace_view in func.tags or not isinstance(func, torch._ops.OpOverload):
            return out
        self.ops += 1
        self.op_bytes += sum(_nbytes(t) for t in tensors_of((args, kwargs)) + tensors_of(out))
        name = _base_name(func)
        self.calls[name] += 1
        shape = [list(t.shape) for t in tensors_of(args)]
        _note_shape(self.shapes.setdefault(name, []), shape)
        self.syncs += name in SYNC_OPS or _copies_to_host(name, args, out)
        packet = func._overloadpacket
        sibling = getattr(torch.ops.aten, name, None)
        inside = fused(name, args, kwargs)
        if packet in self.registry:  # FlopCounterMode counts its matmuls; roles and the timeline need them per call
            flops = self.registry[packet](*args, **kwargs, out_val=out)
            rest = [(r, f) for r, f in inside or [] if r != "matmul"]
            self._roles(name, [("matmul", flops)] + rest, shape)
            if rest:
                self.parts["fused"] += sum(f for _, f in rest)
                self.op_flops[name] += sum(f for _, f in rest)
            if self.timeline is not None:
                self.timeline.append((time.perf_counter_ns(), name, flops + sum(f for _, f in rest), _dtype(out)))
            return out
        if inside is not None:
            self._roles(name, inside, shape)
            self._add("fused", name, int(sum(f for _, f in inside)), out)
        elif sibling is not None and sibling in self.registry:  # e.g. baddbmm_: FlopCounterMode misses in-place
            self._add("matmul_inplace", name, self.registry[sibling](*args, **kwargs, out_val=out), out, shape, "matmul")
        elif name in _DATA_MOVEMENT:
            pass
        elif torch.Tag.pointwise in func.tags:
            outs = tensors_of(out)
            self._add("pointwise", name, outs[0].numel() if outs else 0, out, shape, role(name, args, out))
        elif torch.Tag.reduction in func.tags:
            ins = tensors_of(args)
            self._add("reduction", name, max((t.numel() for t in ins), default=0), out, shape, role(name, args, out))
        else:
            self.uncounted[str(func)] += 1
        return out

    def _add(self, part: str, name: str, flops: int, out: Any = None, shape: list | None = None,
             as_role: str | None = None) -> None:
        self.parts[part] += flops
        self.op_flops[name] += flops
        if as_role is not None:
            self._roles(name, [(as_role, flops)], shape or [])
        if self.timeline is not None:
            self.timeline.append((time.perf_counter_ns(), name, flops, _dtype(out)))

    def _roles(self, name: str, parts: list[tuple[str, float]], shape: list) -> None:
        for part_role, flops in parts:
            self.role_calls[part_role] += 1
            self.role_flops[part_role] += flops
            _note_shape(self.role_shapes.setdefault(part_role, []), shape)
            ops = self.role_ops.setdefault(part_role, [])
            if name not in ops:
                ops.append(name)


def _note_shape(seen: list, shape: list) -> None:
    if len(seen) < MAX_SHAPES and shape not in seen:
        seen.append(shape)


def _copies_to_host(name: str, args: tuple, out: Any) -> bool:
    """A copy from a device tensor into host memory (.cpu(), .to('cpu'), .numpy() of a CUDA tensor)."""
    if name not in ("_to_copy", "copy"):
        return False
    ins, outs = tensors_of(args), tensors_of(out)
    return bool(ins and outs) and ins[-1].device.type != "cpu" and outs[0].device.type == "cpu"


def _dtype(out: Any) -> str:
    outs = tensors_of(out)
    return str(outs[0].dtype).removeprefix("torch.") if outs else ""


def _io_bytes(case: Case, fn: Callable[..., Any]) -> tuple[Any, float]:
    """Run fn on case; return its result and the lower-bound bytes (inputs once, outputs and mutated inputs once)."""
    inputs = tensors_of((case.args, case.kwargs))
    versions = [t._version for t in inputs]
    result = call(fn, case)
    seen: set[tuple[int, int, torch.dtype]] = set()
    total = 0

    def add(t: torch.Tensor) -> None:
        nonlocal total
        ident = (t.data_ptr(), t.numel(), t.dtype)
        if ident not in seen:
            seen.add(ident)
            total += _nbytes(t)

    for t in inputs:
        add(t)
    seen.clear()  # writes are counted apart from reads
    for t, v in zip(inputs, versions):
        if t._version != v:
            add(t)
    for t in tensors_of(result):
        add(t)
    return result, float(total)


def count_work(fn: Callable[..., Any], case: Case, timeline: list | None = None) -> WorkCount:
    """Run fn on case once and count: FlopCounterMode for matmul-like ops, the rules above for the rest.

    timeline: a list to append (perf_counter_ns, op, FLOPs, output dtype) to for each op that does arithmetic."""
    counter = FlopCounterMode(display=False)
    ops = _OpCounter(counter.flop_registry, timeline)
    with counter, ops:
        _, nbytes = _io_bytes(case, fn)
    parts = {"matmul": float(counter.get_total_flops()), **{k: float(v) for k, v in ops.parts.items()}}
    for packet, flops in counter.get_flop_counts().get("Global", {}).items():
        ops.op_flops[str(packet).split(".")[-1]] += flops
    by_op = {name: (calls, float(ops.op_flops[name])) for name, calls in ops.calls.items()}
    by_role = {name: (calls, float(ops.role_flops[name])) for name, calls in ops.role_calls.items()}
    return WorkCount(flops=sum(parts.values()), bytes=nbytes, source="counted", ops=ops.ops,
                     op_bytes=float(ops.op_bytes), parts=parts, uncounted_ops=dict(ops.uncounted), by_op=by_op,
                     shapes=ops.shapes, by_role=by_role, role_shapes=ops.role_shapes, role_ops=ops.role_ops,
                     syncs=ops.syncs)


def work_of(fn: Callable[..., Any], case: Case) -> WorkCount:
    """The call's work: its registered formula when there is one (ops and op_bytes still counted), else counted."""
    counted = count_work(fn, case)
    found = formula_for(fn)
    if found is None:
        return counted
    name, formula = found
    flops, nbytes = formula(case)
    return WorkCount(flops=flops, bytes=nbytes, source=f"formula:{name}", ops=counted.ops, op_bytes=counted.op_bytes,
                     parts={"counted_total": counted.flops, **counted.parts}, uncounted_ops=counted.uncounted_ops,
                     syncs=counted.syncs)
