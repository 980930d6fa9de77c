"""Why a candidate's numbers differ from the reference's: controlled re-runs that tell precision causes apart.

An error level alone cannot say whether operands were rounded, partial sums were added at low precision, the
sum ran in another order, or values are wrong: a bf16 reduction of fp32 partials lands near the bf16-operand
level. So the candidate and the reference run again, on the failing case's own inputs changed to isolate
each cause:

- integer inputs (sparse ternary, every product and partial sum an integer below 256): exact in bf16 and in
  every wider format, so any difference left is wrong or missing values, never rounding; cutting the reduced
  axis then shows from which K the values go wrong;
- inputs already exact at a precision (8, 11, then 16 significant bits): operand rounding to that precision
  or coarser vanishes, while accumulation at low precision does not; the widest rung that still removes the
  error is the operands' precision;
- the reduced axis cut to powers of two: an error flat in K is per element (the output's rounding), one that
  grows with K is accumulation at low precision, and the K where it starts to grow is the partial's size;
- an error within fp32's own bound for this K is another summation order at full precision.
"""
from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from infragent.probes.inputs import Case, call, tensors_of
from infragent.probes.output_diff import diff_outputs, output_tensors
from infragent.probes.precision import tolerance

OPERAND_RUNGS = ((8, "bf16 (8-bit significand)"), (11, "tf32 or fp16 (11-bit significand)"),
                 (16, "a split such as bf16x3 (about 16 bits)"))
VANISHED = 1 / 16  # an error that falls to this share of its level (or into fp32's bound) is gone
GROWTH = 2.0  # the error at the full K over its flat level: accumulation, not a per-element rounding
RISE = 1.5  # a K whose error exceeds the flat level this much starts the growth
SMALLEST_K = 16
DRAWS = 3


@dataclass
class PrecisionCause:
    """The cause of a precision difference, the one-line finding that names it, and the re-runs behind it."""

    cause: str  # wrong values | operand rounding | low-precision accumulation | summation order | output rounding | unknown
    finding: str
    precision: str = ""  # the operands' precision, for operand rounding
    threshold_k: int | None = None  # the K from which the error appears or grows
    evidence: dict[str, Any] = field(default_factory=dict)

    def row(self) -> dict[str, Any]:
        """JSON-safe summary."""
        return {"cause": self.cause, "finding": self.finding, "precision": self.precision,
                "threshold_k": self.threshold_k, "evidence": self.evidence}


def precision_cause(candidate: Callable[..., Any], reference: Callable[..., Any], case: Case,
                    reduction: int | None = None, seed: int = 0, budget_s: float = 30.0) -> PrecisionCause:
    """Name the cause of the difference between candidate and reference on `case` by controlled re-runs
    (module docstring); reduction: the length of the reduced axis (default: the case's). A re-run that raises
    or overruns budget_s ends it with cause "unknown" and says why."""
    runs = _Runs(candidate, reference, seed, time.monotonic() + budget_s)
    try:
        return _diagnose(runs, case, reduction or case.reduction)
    except TimeoutError:
        return PrecisionCause("unknown", f"the re-runs that tell precision causes apart did not finish within "
                              f"{budget_s:g} s", evidence={"budget_s": budget_s})
    except RerunFailed as err:
        return PrecisionCause("unknown", f"a re-run on changed inputs failed: {err}", evidence={"error": str(err)})


def _diagnose(runs: "_Runs", case: Case, k: int | None) -> PrecisionCause:
    level = runs.error(case)
    evidence: dict[str, Any] = {"reduction": k, "error": level}
    if not level > 0:
        return PrecisionCause("unknown", "the candidate matches the reference on this case", evidence=evidence)
    axes = _reduced_axes(case, k, runs) if k else None
    exact = max(runs.error(_integers(case, k or 1, d, runs.seed)) for d in range(DRAWS))
    evidence["integer_inputs_error"] = exact
    if exact > 0:
        return _wrong_values(case, k, axes, runs, exact, evidence)
    fp32 = tolerance(torch.float32, k or 1)
    if level <= fp32:
        return PrecisionCause("summation order", f"another summation order at full precision: error {level:.1e} "
                              f"is within fp32's bound for K={k} ({fp32:.1e}), and exact inputs give none",
                              evidence=evidence)
    rungs = {}
    for bits, name in OPERAND_RUNGS:
        rungs[bits] = max(runs.error(_rounded(case, bits, d, runs.seed)) for d in range(DRAWS))
    evidence["exact_operand_errors"] = {str(bits): e for bits, e in rungs.items()}
    gone = [bits for bits, e in rungs.items() if e <= max(VANISHED * level, fp32)]
    if gone and gone[0] == OPERAND_RUNGS[0][0]:
        widest = max(b for b in gone if all(c in gone for c in rungs if c <= b))
        name = dict(OPERAND_RUNGS)[widest]
        above = next((b for b in rungs if b > widest), None)
        stays = f"; exact in {above} bits it stays at {rungs[above]:.1e}" if above else ""
        return PrecisionCause("operand rounding", f"operands rounded to {name}: with inputs exact in {widest} "
                              f"significant bits the error ({level:.1e}) falls to {rungs[widest]:.1e}{stays}",
                              precision=name, evidence=evidence)
    if axes is None:
        return PrecisionCause("unknown", f"error {level:.1e} stays with inputs exact in bf16 ({rungs[8]:.1e}): not "
                              "operand rounding; the reduced axis could not be cut to tell accumulation from "
                              "output rounding", evidence=evidence)
    sweep = _sweep(case, k, axes, runs)
    evidence["error_by_k"] = {str(kk): e for kk, e in sweep}
    if len(sweep) < 2:
        return PrecisionCause("unknown", f"error {level:.1e} stays with inputs exact in bf16: not operand rounding; "
                              "the candidate ran at fewer than two cut lengths of the reduced axis",
                              evidence=evidence)
    flat = sweep[0][1]
    growth = sweep[-1][1] / flat if flat > 0 else math.inf
    if growth >= GROWTH:
        start = _growth_start(sweep, flat)
        below = max((kk for kk, _ in sweep if kk < start), default=None)
        flat_text = (f"flat at {flat:.1e} up to K={below}" if below else f"{flat:.1e} at K={sweep[0][0]}")
        return PrecisionCause("low-precision accumulation",
                              f"accumulation or reduction at reduced precision: the error grows with K ({flat_text}, "
                              f"x{growth:.0f} by K={sweep[-1][0]}) from K={start}, and inputs exact in bf16 leave "
                              f"it ({rungs[8]:.1e}): partial sums of about {below or sweep[0][0]} terms are added "
                              "at low precision, not the operands rounded", threshold_k=start, evidence=evidence)
    return PrecisionCause("output rounding", f"a per-element rounding: the error {level:.1e} is flat in K "
                          f"(x{growth:.1f} from K={sweep[0][0]} to {sweep[-1][0]}) and stays with inputs exact in "
                          "bf16: the result is rounded to a lower precision once", evidence=evidence)


class RerunFailed(RuntimeError):
    """The candidate or the reference raised, or their outputs differ in structure, on a changed case."""


class _Runs:
    """Candidate-vs-reference errors on changed cases, within a deadline."""

    def __init__(self, candidate: Callable[..., Any], reference: Callable[..., Any], seed: int,
                 deadline: float) -> None:
        self.candidate, self.reference, self.seed, self.deadline = candidate, reference, seed, deadline

    def outputs(self, case: Case) -> tuple[Any, Any]:
        """(candidate's, reference's) outputs on case."""
        if time.monotonic() > self.deadline:
            raise TimeoutError("precision cause: budget spent")
        try:
            return call(self.candidate, case), call(self.reference, case)
        except Exception as err:  # noqa: BLE001 (the callables' own errors on changed inputs are answers)
            raise RerunFailed(f"{type(err).__name__}: {err}") from err

    def error(self, case: Case, elementwise: bool = False) -> float:
        """The check's max relative error (|c - r| / max(|r|, rms(r))); elementwise: the worst |c - r| / |r|
        over elements of some size (|r| >= rms / 4), bounded by one rounding's relative error."""
        out, ref = self.outputs(case)
        diff = diff_outputs(out, ref)
        if diff.problem:
            raise RerunFailed(diff.problem)
        if not elementwise:
            return diff.max_rel_err
        worst = 0.0
        for c, r in zip(output_tensors(out), output_tensors(ref)):
            if not (c.is_floating_point() and r.is_floating_point()) or not r.numel():
                worst = max(worst, float((c != r).any()))
                continue
            c64, r64 = c.double(), r.double()
            rms = r64.pow(2).mean().sqrt()
            sized = r64.abs() >= rms / 4
            if sized.any():
                worst = max(worst, ((c64 - r64).abs()[sized] / r64.abs()[sized]).max().item())
        return worst


def _floats(case: Case) -> list[torch.Tensor]:
    return [t for t in tensors_of((case.args, case.kwargs)) if t.is_floating_point()]


def _mapped(case: Case, fn: Callable[[int, torch.Tensor], torch.Tensor]) -> Case:
    """case with each floating tensor t (the i-th) replaced by fn(i, t); other arguments kept."""
    counter = itertools.count()

    def walk(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return fn(next(counter), value) if value.is_floating_point() else value.clone()
        if isinstance(value, dict):
            return {key: walk(v) for key, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(walk(v) for v in value)
        return value

    return Case(walk(case.args), walk(case.kwargs), case.label, case.reduction)


def _shuffled(t: torch.Tensor, draw: int, seed: int, index: int) -> torch.Tensor:
    """Draw 0: t itself; later draws: t's own values in a seeded random order (the same distribution)."""
    if draw == 0 or t.numel() < 2:
        return t.clone()
    generator = torch.Generator().manual_seed(seed * 7919 + draw * 104_729 + index)
    return t.reshape(-1)[torch.randperm(t.numel(), generator=generator)].reshape(t.shape).clone()


def round_significand(t: torch.Tensor, bits: int) -> torch.Tensor:
    """t rounded to `bits` significant bits (the implicit leading one included), in t's dtype."""
    mantissa, exponent = torch.frexp(t.double())
    return torch.ldexp(torch.round(mantissa * 2.0 ** bits) / 2.0 ** bits, exponent.double()).to(t.dtype)


def _rounded(case: Case, bits: int, draw: int, seed: int) -> Case:
    return _mapped(case, lambda i, t: round_significand(_shuffled(t, draw, seed, i), bits))


def _integers(case: Case, k: int, draw: int, seed: int) -> Case:
    """Sparse ternary inputs: each value -1, 0 or 1, nonzero with p = min(1, 8 / sqrt(K)), so a sum of K
    products holds about 64 nonzero terms and its partial sums stay far below 256 (exact in bf16)."""
    p = min(1.0, 8 / math.sqrt(max(k, 1)))

    def ternary(i: int, t: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator().manual_seed(seed * 6007 + draw * 31 + i)
        signs = torch.randint(0, 2, t.shape, generator=generator) * 2 - 1
        keep = torch.rand(t.shape, generator=generator) < p
        return (signs * keep).to(t.dtype)

    return _mapped(case, ternary)


def _cut(case: Case, axes: tuple[int | None, ...], k: int) -> Case:
    """The case with each floating tensor's reduced axis (None: none) cut to its first k entries."""
    return _mapped(case, lambda i, t: t.clone() if axes[i] is None else t.narrow(axes[i], 0, k).contiguous())


def _reduced_axes(case: Case, k: int, runs: _Runs) -> tuple[int | None, ...] | None:
    """Per floating tensor, the axis of length k that is reduced: the combination whose cut keeps the
    reference's output shapes (a reduced axis never reaches the output); None when no combination does."""
    floats = _floats(case)
    choices = [[a for a, size in enumerate(t.shape) if size == k] or [None] for t in floats]
    if k < 2 * SMALLEST_K or all(c == [None] for c in choices):
        return None
    want = [tuple(t.shape) for t in output_tensors(call(runs.reference, case))]
    for combo in itertools.islice(itertools.product(*[list(reversed(c)) for c in choices]), 32):
        try:
            got = [tuple(t.shape) for t in output_tensors(call(runs.reference, _cut(case, combo, k // 2)))]
        except Exception:  # noqa: BLE001 (a cut the reference refuses is not the reduced axis)
            continue
        if got == want:
            return combo
    return None


def _ks(k: int) -> list[int]:
    ks = [2 ** e for e in range(int(math.log2(SMALLEST_K)), int(math.log2(k)) + 1) if 2 ** e <= k]
    return ks + ([k] if ks[-1] != k else [])


def _by_k(runs: _Runs, k: int, make: Callable[[int, int], Case], elementwise: bool) -> list[tuple[int, float]]:
    """(K, worst error over draws) for K = 16, 32, ... up to k, the case for (K, draw) from make; a K the
    candidate refuses (its own size rules) is left out."""
    found = []
    for kk in _ks(k):
        try:
            found.append((kk, max(runs.error(make(kk, d), elementwise) for d in range(DRAWS))))
        except RerunFailed:
            continue
    return found


def _sweep(case: Case, k: int, axes: tuple[int | None, ...], runs: _Runs) -> list[tuple[int, float]]:
    """The elementwise error at each cut length of the reduced axis, on the case's own values."""
    return _by_k(runs, k, lambda kk, d: _cut(_mapped(case, lambda i, t: _shuffled(t, d, runs.seed, i)), axes, kk),
                 elementwise=True)


def _growth_start(sweep: list[tuple[int, float]], flat: float) -> int:
    """The smallest K from which every error exceeds the flat level by RISE."""
    start = sweep[-1][0]
    for kk, e in reversed(sweep):
        if e <= RISE * flat:
            break
        start = kk
    return start


def _wrong_values(case: Case, k: int | None, axes: tuple[int | None, ...] | None, runs: _Runs, exact: float,
                  evidence: dict[str, Any]) -> PrecisionCause:
    """Exact arithmetic still differs: name it, and where along the reduced axis it starts when it can be cut."""
    if axes is not None and k:
        by_k = _by_k(runs, k, lambda kk, d: _cut(_integers(case, k, d, runs.seed), axes, kk), elementwise=False)
        evidence["integer_error_by_k"] = {str(kk): e for kk, e in by_k}
        first = next((kk for kk, e in by_k if e > 0), None)
        if first is not None:
            clean = max((kk for kk, e in by_k if kk < first), default=None)
            where = (f"; exact up to K={clean}, wrong from K={first} (a dropped or misplaced block of the reduction?)"
                     if clean else f"; wrong already at K={first}")
            return PrecisionCause("wrong values", f"values wrong, not rounding: on integer inputs, exact in every "
                                  f"precision, the error is still {exact:.1e}{where}", threshold_k=first,
                                  evidence=evidence)
    return PrecisionCause("wrong values", f"values wrong, not rounding: on integer inputs, exact in every precision, "
                          f"the error is still {exact:.1e}", evidence=evidence)
