"""Partition specs ('column:4', 'splitk:4', 'heads:4:dim=1', 'batch:2'): parse, shard a case, combine; and the
partitioned check: the candidate and reference shard by shard, and a full-run mismatch located in shard terms.

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

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from infragent.probes.guards import clone_value
from infragent.probes.inputs import Case, call
from infragent.probes.output_diff import OutputDiff, diff_outputs


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


@dataclass
class Localization:
    """Where a full-run mismatch lies in shard terms (concatenating partitions only)."""

    shard: int  # shard holding the first bad index
    shards: list[int]  # every shard with a bad element
    slice: str  # e.g. "output[:, 512:768]"
    range: tuple[int, int]  # [start, stop) of that shard along the partitioned output axis
    bad_per_shard: dict[int, int]
    bad_along: list[int] = field(default_factory=list)  # indices along that axis with a bad element (first 8)
    bad_along_count: int = 0


def localize(spec: PartitionSpec, comparison: OutputDiff) -> Localization | None:
    """Map a comparison's bad elements to the shards of spec's output axis."""
    bounds = output_bounds(spec, comparison.shape)
    if bounds is None or comparison.bad_mask is None or comparison.first_bad_index is None:
        return None
    axis = spec.out % len(comparison.shape)
    per_axis = comparison.bad_mask.movedim(axis, 0).reshape(comparison.shape[axis], -1).any(dim=1)
    counts = {i: int(per_axis[start:stop].sum()) for i, (start, stop) in enumerate(bounds)}
    shard = shard_of(spec, comparison.shape, comparison.first_bad_index)
    start, stop = bounds[shard]
    name = "output" if comparison.output == 0 else f"output {comparison.output}"
    along = per_axis.nonzero().flatten().tolist()
    return Localization(shard, [i for i, n in counts.items() if n], name + slice_text(len(comparison.shape), axis, start, stop),
                        (start, stop), {i: n for i, n in counts.items() if n}, along[:8], len(along))


@dataclass
class ShardRun:
    """The candidate and the reference on one shard's inputs."""

    index: int
    inputs: str
    comparison: OutputDiff | None
    error: str = ""


@dataclass
class PartitionRun:
    """Partitioned execution of one case: per-shard comparisons and the combined result vs the full reference."""

    shards: list[ShardRun]
    combined: OutputDiff | None
    error: str = ""

    @property
    def bad_shards(self) -> list[ShardRun]:
        """Shards where the candidate disagrees with the reference on the same shard (or raised)."""
        return [s for s in self.shards if s.error or (s.comparison and not s.comparison.ok)]

    @property
    def ok(self) -> bool:
        """True when every shard and the combined result agree."""
        return not self.error and not self.bad_shards and self.combined is not None and self.combined.ok


def run_partitioned(candidate: Callable[..., Any], reference: Callable[..., Any], spec: PartitionSpec,
                    case: Case, full_reference: Any, rtol: float | None = None) -> PartitionRun:
    """Run candidate and reference per shard, compare them, then combine the candidate's shards."""
    shards, outputs = [], []
    for shard in split_case(spec, case):
        try:
            ref_out = call(reference, clone_value(shard.case))
        except Exception as err:
            raise PartitionError(f"partition {spec.text!r}: the reference fails on shard {shard.index} "
                                 f"({shard.inputs}): {type(err).__name__}: {err}") from err
        try:
            out = call(candidate, shard.case)
        except Exception as err:
            shards.append(ShardRun(shard.index, shard.inputs, None, f"{type(err).__name__}: {err}"))
            continue
        outputs.append(out)
        shards.append(ShardRun(shard.index, shard.inputs, diff_outputs(out, ref_out, case.reduction, rtol)))
    if len(outputs) < len(shards):
        return PartitionRun(shards, None, "the candidate raised on a shard")
    try:
        combined = diff_outputs(combine(spec, outputs), full_reference, case.reduction, rtol)
    except Exception as err:
        return PartitionRun(shards, None, f"combining shard outputs failed: {type(err).__name__}: {err}")
    return PartitionRun(shards, combined)
