"""The check probe: compare a candidate with a reference on fresh random inputs, guard, and localize.

Every trial draws new inputs; the reference runs on a copy of them and the candidate on the
originals. Errors are relative to max(|reference|, rms(reference)) with a dtype- and K-dependent
tolerance (see precision.tolerance). Guards catch a candidate that mutates its inputs, returns
views of them, caches or ignores them, or makes NaN/Inf where the reference is finite. With a
partition spec (see partition.py) the candidate also runs shard by shard, and a full-run mismatch is
mapped to the shard whose output block holds it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from infragent.probes.output_diff import OutputDiff, diff_outputs
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.guards import GuardHit, aliased_output, clone_value, dependence_guard, mutated_argument, param_names
from infragent.probes.inputs import Case, InputsFactory, call, draw, tensors_of
from infragent.probes.precision import ERROR_LEVELS, likely_precision
from infragent.probes.precision_cause import PrecisionCause, precision_cause
from infragent.probes.partition import (Localization, PartitionError, PartitionRun, PartitionSpec, localize,
                                        parse_partition, run_partitioned)

__all__ = ["PartitionError", "OutputDiff", "GuardHit", "Localization", "PartitionRun", "TrialResult",
           "diff_outputs", "matmul_inputs", "run_check", "MATMUL_SHAPES"]

# (M, K, N) of x[M, K] @ w[K, N]: odd sizes, a GEMV, long and short reductions.
MATMUL_SHAPES = [(1, 64, 64), (17, 1023, 5), (64, 256, 129), (3, 4096, 7),
                 (128, 512, 256), (5, 2048, 33), (32, 1024, 1024), (2, 3000, 96)]
GUARDS = ("input_mutation", "output_alias", "output_reuse", "output_caching", "constant_output",
          "nonfinite_output")  # in the order their findings take precedence


def matmul_inputs(trial: int, generator: torch.Generator) -> Case:
    """(x, w) standard-normal fp32 operands; the shape cycles through MATMUL_SHAPES by trial."""
    m, k, n = MATMUL_SHAPES[trial % len(MATMUL_SHAPES)]
    x = torch.randn(m, k, generator=generator)
    w = torch.randn(k, n, generator=generator)
    return Case((x, w), label=f"{m}x{k}x{n}", reduction=k)


@dataclass
class TrialResult:
    """One trial: the case, the full-run comparison, and the partition results when asked."""

    trial: int
    label: str
    shapes: list[tuple[int, ...]]
    reduction: int | None
    comparison: OutputDiff | None
    error: str = ""  # the candidate raised
    reference_error: str = ""
    localization: Localization | None = None
    partitioned: PartitionRun | None = None

    def row(self) -> dict[str, Any]:
        """JSON-safe summary."""
        row: dict[str, Any] = {"trial": self.trial, "label": self.label, "shapes": [list(s) for s in self.shapes],
                               "reduction": self.reduction}
        if self.comparison:
            row.update(self.comparison.row())
        if self.error or self.reference_error:
            row["error"] = self.error or f"reference: {self.reference_error}"
        if self.localization:
            row["bad_shards"] = self.localization.shards
        if self.partitioned:
            p = self.partitioned
            row["partitioned"] = {"bad_shards": [s.index for s in p.bad_shards], "error": p.error,
                                  "combined": p.combined.row() if p.combined else None,
                                  "shards": [{"shard": s.index, "inputs": s.inputs, "error": s.error,
                                              **(s.comparison.row() if s.comparison else {})} for s in p.shards]}
        return row


def _reduction_of(case: Case) -> int:
    """The case's reduction length, else (conservatively) the longest input axis."""
    if case.reduction:
        return case.reduction
    sizes = [s for t in tensors_of((case.args, case.kwargs)) for s in t.shape]
    return max(sizes, default=1)


def _trial(candidate: Callable[..., Any], reference: Callable[..., Any], case: Case, trial: int,
           spec: PartitionSpec | None, rtol: float | None, params: list[str], hits: list[GuardHit]) -> TrialResult:
    """Run one case through the reference, the candidate, the guards and the partition."""
    shapes = [tuple(t.shape) for t in tensors_of((case.args, case.kwargs))]
    reduction = _reduction_of(case)
    label = case.label or f"trial {trial}"
    result = TrialResult(trial, label, shapes, case.reduction, None)
    pristine, ref_case = clone_value(case), clone_value(case)
    try:
        ref_out = call(reference, ref_case)
    except Exception as err:
        result.reference_error = f"{type(err).__name__}: {err}"
        return result
    try:
        out = call(candidate, case)
    except Exception as err:
        result.error = f"{type(err).__name__}: {err}"
        return result
    seen = {h.guard for h in hits}
    changed = mutated_argument(pristine, case, params)
    if changed and "input_mutation" not in seen and not mutated_argument(pristine, ref_case, params):
        hits.append(GuardHit("input_mutation", f"candidate mutates its input {changed}", trial, label,
                             {"argument": changed}))
    aliased = aliased_output(out, case, params)
    if aliased and "output_alias" not in seen and not aliased_output(ref_out, ref_case, params):
        hits.append(GuardHit("output_alias", f"candidate output aliases its input {aliased} (shares its storage)",
                             trial, label, {"argument": aliased}))
    comparison = diff_outputs(out, ref_out, reduction, rtol)
    result.comparison = comparison
    if comparison.nonfinite and "nonfinite_output" not in seen:
        hits.append(GuardHit("nonfinite_output", f"candidate produces NaN/Inf where the reference is finite: "
                             f"{comparison.nonfinite} element(s), first at {comparison.first_nonfinite}",
                             trial, label, {"first_nonfinite_index": comparison.first_nonfinite}))
    if spec is not None:
        if not comparison.ok and not comparison.problem:
            result.localization = localize(spec, comparison)
        result.partitioned = run_partitioned(candidate, reference, spec, pristine, ref_out, rtol)
    return result


def run_check(candidate: Callable[..., Any], reference: Callable[..., Any], factory: InputsFactory,
              partition: str | None = None, trials: int = 24, *, seed: int = 0, rtol: float | None = None,
              guards: bool = True, budget_s: float | None = None) -> Feedback:
    """Compare candidate with reference over `trials` fresh input draws; guard and localize; one Feedback.

    partition: a spec such as 'column:4' (see partition.py); raises PartitionError when it is malformed
    or does not fit the inputs. rtol overrides the dtype/K tolerance. guards=False skips the
    dependence guard (constant output, caching), which makes extra candidate calls. budget_s: no trial is
    started that the last one's time says would end past it; a pass on fewer trials than asked is
    "inconclusive: budget".
    """
    spec = parse_partition(partition) if partition else None
    params = param_names(candidate)
    started = time.monotonic()
    hits = dependence_guard(candidate, reference, factory, seed, rtol) if guards else []
    results: list[TrialResult] = []
    last = 0.0
    for t in range(trials):
        if budget_s is not None and results and time.monotonic() - started + last > budget_s:
            break
        began = time.monotonic()
        results.append(_trial(candidate, reference, draw(factory, t, seed), t, spec, rtol, params, hits))
        last = time.monotonic() - began
    cause = _cause(candidate, reference, factory, seed, results, hits, budget_s, started)
    feedback = _feedback(spec, results, hits, cause)
    if len(results) < trials:
        feedback.details["budget_hit"] = True
        feedback.finding += (f" (stopped after {len(results)} of {trials} trials: budget_s={budget_s:g} spent, "
                             f"{time.monotonic() - started:.1f} s)")
        if feedback.verdict == "pass":
            feedback.verdict, feedback.finding = "inconclusive", "inconclusive: budget: " + feedback.finding
        feedback.next_probes.insert(0, f"check again with budget_s={2 * (budget_s or 0) + 10:.0f} for all "
                                       f"{trials} trials")
    return feedback


CAUSE_BUDGET_S = 30.0  # for the controlled re-runs that name a precision cause, when check has no budget


def _cause(candidate: Callable[..., Any], reference: Callable[..., Any], factory: InputsFactory, seed: int,
           results: list[TrialResult], hits: list[GuardHit], budget_s: float | None,
           started: float) -> PrecisionCause | None:
    """The precision cause of the first full-run mismatch (precision_cause.py), when the check fails on values
    alone: no guard hit, nothing raised, shapes alike, and the error not already plain (missing values)."""
    bad = next((r for r in results if r.comparison and not r.comparison.ok and not r.comparison.problem), None)
    if bad is None or hits or any(r.error for r in results):
        return None
    c = bad.comparison
    if c.bad and c.zeros >= MISSING_SHARE * c.bad:
        return None
    left = CAUSE_BUDGET_S if budget_s is None else budget_s - (time.monotonic() - started)
    if left <= 0:
        return None
    case = draw(factory, bad.trial, seed)
    return precision_cause(candidate, reference, case, reduction=_reduction_of(case), seed=seed, budget_s=left)


def _only(spec: PartitionSpec, loc: Localization) -> str:
    """' (column 700 only)' when few indices along the partitioned axis are bad."""
    if not loc.bad_along or loc.bad_along_count > 4 or loc.bad_along_count == loc.range[1] - loc.range[0]:
        return ""
    word = {"column": "column", "row": "row", "batch": "row", "heads": "head"}.get(spec.kind, "index")
    plural = "s" if loc.bad_along_count > 1 else ""
    return f" ({word}{plural} {', '.join(map(str, loc.bad_along))} only)"


def _err(x: float) -> str:
    return f"{x:.1e}"


def _partitioned_comparisons(results: list[TrialResult]) -> list[tuple[TrialResult, str, OutputDiff]]:
    """(trial, 'shard I' or 'combined', comparison) for every partitioned comparison that ran."""
    return [(r, name, c) for r in results if r.partitioned
            for name, c in [(f"shard {s.index}", s.comparison) for s in r.partitioned.shards]
            + [("combined", r.partitioned.combined)] if c is not None]


def worst_partitioned(results: list[TrialResult]) -> float:
    """The largest relative error over every trial's shards and combined output: numbers/max_rel_err_partitioned."""
    return max((c.max_rel_err for _, _, c in _partitioned_comparisons(results)), default=float("nan"))


def worst_unpartitioned(results: list[TrialResult]) -> float:
    """The largest relative error of the full runs compared: numbers/max_rel_err."""
    return max((r.comparison.max_rel_err for r in results if r.comparison and not r.comparison.problem),
               default=float("nan"))


WRONG_LEVEL = 2.0 ** (max(ERROR_LEVELS.values()) + 3)  # 8x the coarsest operand precision's error level: not rounding
MISSING_SHARE = 0.9  # of the bad elements exactly 0 where the reference is not: values missing


def _precision_note(max_rel_err: float, comparison: OutputDiff | None = None,
                    cause: PrecisionCause | None = None) -> str:
    """What kind of error this is: values missing (zeros where the reference has values), the cause the
    controlled re-runs named, values wrong (an error far above any precision's rounding level: no dtype is to
    blame), or else the error level of an operand precision, said to be a level only."""
    if comparison is not None and comparison.bad and comparison.zeros >= MISSING_SHARE * comparison.bad:
        return (f"; values wrong, missing: the candidate gives 0 where the reference does not ({comparison.zeros} "
                f"of {comparison.bad} bad elements), not a rounding difference (no dtype is to blame)")
    if cause is not None and cause.cause != "unknown":
        return f"; cause: {cause.finding}"
    if max_rel_err > WRONG_LEVEL:
        return (f"; values wrong: an error of {max_rel_err:.2g} is far above any precision's rounding level "
                "(no dtype is to blame)")
    name = likely_precision(max_rel_err)
    return "" if name.startswith(("fp32", "exact")) else f"; an error level typical of {name} (the level only)"


def _finding(spec: PartitionSpec | None, results: list[TrialResult], hits: list[GuardHit],
             cause: PrecisionCause | None = None) -> tuple[str, str, dict[str, Any]]:
    """(verdict, one-line finding, locality) from the trials and guard hits."""
    compared = [r for r in results if r.comparison and not r.comparison.problem]
    if hits:
        hit = min(hits, key=lambda h: GUARDS.index(h.guard))
        return "fail", hit.finding, {"guard": hit.guard, "case": hit.label, **hit.where}
    raised = next((r for r in results if r.error), None)
    if raised:
        return "fail", f"candidate raised {raised.error} on case {raised.label!r}", {"case": raised.label}
    shaped = next((r for r in results if r.comparison and r.comparison.problem), None)
    if shaped:
        return "fail", f"{shaped.comparison.problem} on case {shaped.label!r}", {"case": shaped.label}
    bad = [r for r in compared if not r.comparison.ok]
    if bad:
        first, c = bad[0], bad[0].comparison
        where = {"case": first.label, "shapes": " ".join("x".join(map(str, s)) for s in first.shapes),
                 "first_bad_index": c.first_bad_index}
        loc = first.localization
        worst = worst_unpartitioned(results)  # the number the check records as max_rel_err
        if loc:
            who = (f"shard {loc.shard}" if len(loc.shards) == 1 else
                   f"all {spec.count} shards" if len(loc.shards) == spec.count else
                   "shards " + ", ".join(map(str, loc.shards)))
            verb = "differs" if len(loc.shards) == 1 else "differ"
            where = {"partition": spec.text, "shard": loc.shard, "slice": loc.slice, "range": list(loc.range), **where}
            if len(loc.shards) > 1:
                where["shards"] = loc.shards
            return "fail", (f"{who} of {spec.text} {verb}: {loc.slice}{_only(spec, loc)}, first bad index {c.first_bad_index}, "
                            f"max rel err {_err(worst)} over {len(compared)} trials{_precision_note(worst, c, cause)}"), where
        at = f"output {c.output} index" if c.output else "index"
        overall = "" if _err(worst) == _err(c.max_rel_err) else f"; worst over {len(compared)} trials {_err(worst)}"
        text = (f"differs on {len(bad)}/{len(compared)} trials: first on case {first.label!r} at {at} "
                f"{c.first_bad_index}, max rel err {_err(c.max_rel_err)} there (tol {_err(c.tol)}){overall}"
                f"{_precision_note(worst, c, cause)}")
        if spec and spec.sums and first.partitioned and first.partitioned.bad_shards:
            shards = first.partitioned.bad_shards
            shard = shards[0]
            count = len(first.partitioned.shards)
            if len(shards) == count and count > 1:
                text += f"; on {spec.text} all {count} shards differ too"
            elif len(shards) > 1:
                text += f"; on {spec.text} shards {', '.join(str(b.index) for b in shards)} of {count} differ too"
            else:
                text += f"; on {spec.text} shard {shard.index} ({shard.inputs}) differs too"
            where.update(partition=spec.text, shard=shard.index, inputs=shard.inputs,
                         shards=[b.index for b in shards])
        return "fail", text, where
    part = next((r for r in results if r.partitioned and not r.partitioned.ok), None)
    if part:
        p = part.partitioned
        where = {"partition": spec.text, "case": part.label}
        worst = worst_partitioned(results)  # the number the check records as max_rel_err_partitioned
        if p.bad_shards:
            s = p.bad_shards[0]
            where.update(shard=s.index, inputs=s.inputs, shards=[b.index for b in p.bad_shards])
            here = max((b.comparison.max_rel_err for b in p.bad_shards if b.comparison), default=worst)
            on_case = "" if _err(here) == _err(worst) else f"; {_err(here)} on this case"
            why = s.error or (f"max rel err {_err(worst)} (worst over {len(results)} trials, each shard and the "
                              f"combined output{on_case}), first bad index {s.comparison.first_bad_index}"
                              f"{_precision_note(worst, s.comparison)}")
            who = (f"shard {s.index} ({s.inputs})" if len(p.bad_shards) == 1 else
                   "shards " + ", ".join(f"{b.index} ({b.inputs})" for b in p.bad_shards))
            return "fail", (f"partitioned run {spec.text} differs on {who} on case {part.label!r} while the "
                            f"unpartitioned run agrees: {why}"), where
        overall = ("" if _err(worst) == _err(p.combined.max_rel_err) else
                   f"; worst over {len(results)} trials, each shard and the combined output {_err(worst)}")
        why = p.error or f"max rel err {_err(p.combined.max_rel_err)} on this case (tol {_err(p.combined.tol)}){overall}"
        return "fail", f"partitioned run {spec.text} differs from unpartitioned after combining shards: {why}", where
    ref_errors = [r for r in results if r.reference_error]
    if ref_errors or not compared:
        why = (f": the reference raised {ref_errors[0].reference_error} on case {ref_errors[0].label!r}"
               if ref_errors else "")
        return "inconclusive", f"{len(compared)}/{len(results)} trials compared{why}", {}
    worst = max(compared, key=lambda r: r.comparison.max_rel_err / max(r.comparison.tol, 1e-300))
    text = (f"matches the reference on {len(compared)} trials (closest to tolerance: rel err "
            f"{_err(worst.comparison.max_rel_err)} vs tol {_err(worst.comparison.tol)} on {worst.label!r})")
    if spec:
        parts = _partitioned_comparisons(results)
        if parts:  # the criterion reads the larger of the two errors: say both, and where each comes from
            trial, name, c = max(parts, key=lambda x: x[2].max_rel_err)
            text += (f"; {spec.text} partitioned run agrees (worst rel err {_err(c.max_rel_err)} over every trial, "
                     f"shard and combined output: {name} of {trial.label!r}, vs tol {_err(c.tol)})")
        else:
            text += f"; {spec.text} partitioned run agrees"
    return "pass", text, {}


def _feedback(spec: PartitionSpec | None, results: list[TrialResult], hits: list[GuardHit],
              cause: PrecisionCause | None = None) -> Feedback:
    verdict, finding, locality = _finding(spec, results, hits, cause)
    compared = [r for r in results if r.comparison and not r.comparison.problem]
    n = len(compared)
    numbers = {
        "max_abs_err": Measure(max((r.comparison.max_abs_err for r in compared), default=float("nan")), n=n),
        "max_rel_err": Measure(worst_unpartitioned(results), n=n),
        "max_ulp": Measure(max((r.comparison.max_ulp for r in compared), default=float("nan")), "ulp", n=n),
        "trials": Measure(len(results)),
        "bad_trials": Measure(sum(1 for r in results if r.error or (r.comparison and not r.comparison.ok))),
    }
    if spec:
        numbers["max_rel_err_partitioned"] = Measure(worst_partitioned(results), n=n)
    by_k: dict[int, dict[str, Any]] = {}
    for r in compared:
        if r.reduction:
            entry = by_k.setdefault(r.reduction, {"max_rel_err": 0.0, "tol": r.comparison.tol, "trials": 0})
            entry["max_rel_err"] = max(entry["max_rel_err"], r.comparison.max_rel_err)
            entry["trials"] += 1
    if verdict == "inconclusive":
        next_probes = ["make the reference and the inputs factory run on every trial, then check again"]
    elif verdict == "pass":
        next_probes = ["bench CANDIDATE --vs REFERENCE (correct; now is it faster?)"]
        if spec is None:
            next_probes.append("check --partition column:N | splitk:N | batch:N (sharded execution agrees?)")
    elif hits:
        next_probes = [f"fix the {min(hits, key=lambda h: GUARDS.index(h.guard)).guard} guard finding, then check again"]
    elif spec is None:
        next_probes = ["check --partition column:N | row:N | heads:N | batch:N | splitk:N to localize the differing "
                       "shard"]
    else:
        next_probes = ["check --trials 200 after the fix (more shapes and values)"]
    details = {"trials": [r.row() for r in results],
               "error_by_reduction": {k: by_k[k] for k in sorted(by_k)},
               "guards": [{"guard": h.guard, "finding": h.finding, "trial": h.trial, "case": h.label, **h.where}
                          for h in hits]}
    if cause is not None:
        details["precision_cause"] = cause.row()
    if spec:
        details["partition"] = {"kind": spec.kind, "count": spec.count, "args": spec.args, "dims": spec.dims,
                                "out": spec.out}
    return Feedback("check", verdict, finding, numbers, locality, [], next_probes, details)
