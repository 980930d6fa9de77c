"""Partition specs ('column:4', 'splitk:4', 'heads:4:dim=1', 'batch:2'): parse, shard a case, combine.

Grammar: KIND:COUNT[:OPTIONS], OPTIONS = comma-separated key=value; list values are joined by '+'.

  kind     splits                                    combines               defaults fit fn(x, w) = x @ w
  column   the weight's output axis                  concatenate on out     arg=1, dim=-1, out=-1
  row      the reduction axis of both operands       sum partial outputs    arg=0+1, dim=-1+0
  splitk   (same as row: Megatron row-parallel = split-K)
  heads    a head axis of every tensor argument      concatenate on out     arg=all, dim=1, out=dim
  batch    the leading axis of the activations       concatenate on out     arg=0, dim=0, out=0

Options: arg = positional indices or keyword names ('0+1', 'q+k+v', 'all'); dim = one axis for all
args or one per arg ('-1+0'); out = the output axis shards are concatenated along (cat kinds only).
Shards follow torch.tensor_split: sizes differ by at most one and the first shards get the extra
element; an axis shorter than COUNT leaves empty shards, which are skipped.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from infragent.probes.inputs import Case


class PartitionError(ValueError):
    """A partition spec that cannot be parsed or does not fit the case; the message names the field."""


_DEFAULTS: dict[str, dict[str, Any]] = {
    "column": {"args": (1,), "dims": (-1,), "out": -1},
    "row": {"args": (0, 1), "dims": (-1, 0), "out": None},
    "splitk": {"args": (0, 1), "dims": (-1, 0), "out": None},
    "heads": {"args": None, "dims": (1,), "out": "dim"},
    "batch": {"args": (0,), "dims": (0,), "out": 0},
}
KINDS = tuple(sorted(_DEFAULTS))
_OPTIONS = ("arg", "dim", "out")


@dataclass(frozen=True)
class PartitionSpec:
    """A parsed partition: which argument axes are split into `count` shards and how outputs combine."""

    kind: str
    count: int
    args: tuple[int | str, ...] | None  # None: every tensor argument with enough axes
    dims: tuple[int, ...]  # one per arg, or a single axis for all
    out: int | None  # output axis of the concatenation; None: partial outputs are summed
    text: str

    @property
    def sums(self) -> bool:
        """True when shards hold partial sums of every output element (row / splitk)."""
        return self.out is None


@dataclass
class Shard:
    """One shard of a case: its index, the sharded case and the input slices it holds."""

    index: int
    case: Case
    inputs: str  # e.g. "arg 1[:, 512:768]"


def _fail(text: str, message: str) -> PartitionError:
    return PartitionError(f"partition {text!r}: {message}")


def _ints(text: str, key: str, value: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in value.split("+"))
    except ValueError:
        raise _fail(text, f"option {key}={value!r} must be an integer or integers joined by '+' (e.g. {key}=-1+0)") from None


def parse_partition(text: str) -> PartitionSpec:
    """Parse 'kind:count[:key=value,...]' into a PartitionSpec, or raise PartitionError naming the field."""
    fields = text.strip().split(":")
    if len(fields) < 2 or len(fields) > 3:
        raise _fail(text, "expected kind:count[:options], e.g. column:4, splitk:4 or heads:4:dim=1")
    kind, count_text = fields[0].strip().lower(), fields[1].strip()
    if kind not in _DEFAULTS:
        raise _fail(text, f"kind {kind!r} is not one of {', '.join(KINDS)}")
    if not count_text.isdigit() or int(count_text) < 1:
        raise _fail(text, f"count {count_text!r} must be a positive integer (the number of shards)")
    defaults = _DEFAULTS[kind]
    args, dims, out = defaults["args"], defaults["dims"], defaults["out"]
    options: dict[str, str] = {}
    if len(fields) == 3 and fields[2].strip():
        for item in fields[2].split(","):
            key, eq, value = (s.strip() for s in item.partition("="))
            if key not in _OPTIONS:
                raise _fail(text, f"unknown option {key!r} (options: {', '.join(_OPTIONS)})")
            if not eq or not value:
                raise _fail(text, f"option {key!r} needs a value, e.g. {key}=1")
            options[key] = value
    if "arg" in options:
        value = options["arg"]
        args = None if value in ("all", "*") else tuple(int(v) if v.lstrip("-").isdigit() else v for v in value.split("+"))
    if "dim" in options:
        dims = _ints(text, "dim", options["dim"])
    if args is not None and len(dims) not in (1, len(args)):
        raise _fail(text, f"option dim has {len(dims)} axes but arg names {len(args)} arguments (give one axis, or one per arg)")
    if args is None and len(dims) != 1:
        raise _fail(text, "option dim must be a single axis when arg=all")
    if out == "dim":
        out = dims[0]
    if "out" in options:
        if out is None:
            raise _fail(text, f"option out: {kind} sums partial outputs, so it takes no output axis")
        out = _ints(text, "out", options["out"])[0]
    return PartitionSpec(kind, int(count_text), args, dims, out, text.strip())


def _bounds(size: int, count: int) -> list[tuple[int, int]]:
    """[start, stop) of each torch.tensor_split shard of an axis of `size`."""
    base, extra = divmod(size, count)
    bounds, start = [], 0
    for i in range(count):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def slice_text(ndim: int, dim: int, start: int, stop: int) -> str:
    """'[:, 512:768]' for axis dim of an ndim tensor."""
    dim = dim % ndim if ndim else 0
    return "[" + ", ".join(f"{start}:{stop}" if d == dim else ":" for d in range(max(ndim, 1))) + "]"


def _targets(spec: PartitionSpec, case: Case) -> list[tuple[int | str, int]]:
    """(argument, axis) pairs the spec splits in this case, checked against it."""
    if spec.args is None:
        names = [i for i, a in enumerate(case.args) if isinstance(a, torch.Tensor)]
        names += [k for k, v in case.kwargs.items() if isinstance(v, torch.Tensor)]
        dim = spec.dims[0]
        pairs = [(n, dim) for n in names if -_get(case, n).dim() <= dim < _get(case, n).dim()]
        if not pairs:
            raise _fail(spec.text, f"arg=all: no tensor argument has axis dim={spec.dims[0]}")
        return pairs
    dims = spec.dims if len(spec.dims) == len(spec.args) else spec.dims * len(spec.args)
    pairs = list(zip(spec.args, dims))
    for name, dim in pairs:
        value = _get(case, name)
        if not isinstance(value, torch.Tensor):
            raise _fail(spec.text, f"arg {name!r} is not a tensor argument of case {case.label!r} "
                                   f"({len(case.args)} positional, keywords {sorted(case.kwargs)})")
        if not -value.dim() <= dim < value.dim():
            raise _fail(spec.text, f"dim {dim} is out of range for arg {name!r} of shape {tuple(value.shape)}")
    if spec.sums:
        sizes = {_get(case, n).shape[d] for n, d in pairs}
        if len(sizes) > 1:
            raise _fail(spec.text, "dim: the split axes must have one length (the reduction), got " +
                        ", ".join(f"arg {n} dim {d} = {_get(case, n).shape[d]}" for n, d in pairs))
    return pairs


def _get(case: Case, name: int | str) -> Any:
    if isinstance(name, int):
        return case.args[name] if -len(case.args) <= name < len(case.args) else None
    return case.kwargs.get(name)


def split_case(spec: PartitionSpec, case: Case) -> list[Shard]:
    """The non-empty shards of a case (contiguous copies of the split arguments)."""
    pairs = _targets(spec, case)
    size = _get(case, pairs[0][0]).shape[pairs[0][1]]
    shards = []
    for index, (start, stop) in enumerate(_bounds(size, spec.count)):
        if start == stop:
            continue
        args, kwargs, where = list(case.args), dict(case.kwargs), []
        for name, dim in pairs:
            tensor = _get(case, name)
            lo, hi = _bounds(tensor.shape[dim], spec.count)[index]
            part = tensor.narrow(dim, lo, hi - lo).contiguous().clone()
            if isinstance(name, int):
                args[name] = part
            else:
                kwargs[name] = part
            where.append(f"arg {name}{slice_text(tensor.dim(), dim, lo, hi)}")
        label = f"{case.label} shard {index}/{spec.count}".strip()
        shards.append(Shard(index, Case(tuple(args), kwargs, label, case.reduction), ", ".join(where)))
    return shards


def combine(spec: PartitionSpec, outputs: list[Any]) -> Any:
    """Concatenate (along spec.out) or sum the shard outputs; tuples/lists combine position by position."""
    first = outputs[0]
    if isinstance(first, (tuple, list)):
        return type(first)(combine(spec, [o[i] for o in outputs]) for i in range(len(first)))
    if spec.sums:
        total = outputs[0]
        for part in outputs[1:]:
            total = total + part
        return total
    return torch.cat(list(outputs), dim=spec.out)


def output_bounds(spec: PartitionSpec, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
    """[start, stop) along spec.out of each shard's block of an output of this shape (None if summed)."""
    if spec.sums or not shape:
        return None
    if not -len(shape) <= spec.out < len(shape):
        raise _fail(spec.text, f"out {spec.out} is out of range for an output of shape {tuple(shape)}")
    return _bounds(shape[spec.out], spec.count)


def shard_of(spec: PartitionSpec, shape: tuple[int, ...], index: tuple[int, ...]) -> int | None:
    """Which shard's output block holds this full output index (None when shards sum)."""
    bounds = output_bounds(spec, shape)
    if bounds is None:
        return None
    position = index[spec.out % len(shape)]
    return next(i for i, (start, stop) in enumerate(bounds) if start <= position < stop)
