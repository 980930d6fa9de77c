"""A kernel target's diagnosis: the questions its probes raise (a precision gap under partitioning, work
redone per tile, a thread starved of the GIL, the distance to the reference), each posed when a finding or a
next_probes suggestion calls for it and settled by the probe that can refute it. Every number a settled
claim cites is named by its ledger key and its path inside that record's Feedback
("ladder/check:numbers/max_rel_err/value"), so a reader (or a test) can find it there.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable

from infragent.agent.dispatch import probes_in
from infragent.agent.hypotheses import Hypothesis
from infragent.lab.spec import Knob
from infragent.probes.feedback import Feedback
from infragent.probes.precision import likely_precision

Record = dict[str, Any]  # a Feedback as the ledger keeps it


def _number(record: Record, name: str) -> float | None:
    m = record.get("numbers", {}).get(name)
    return None if m is None or m.get("value") is None else float(m["value"])


def _knobs_for(tags: list[str], knobs: dict[str, Knob]) -> list[str]:
    return [n for n, k in knobs.items() if set(k.touches) & set(tags)]


# question -> (the probe that settles it, the claim while open, what it predicts)
QUESTIONS = {
    "precision": ("check", "the candidate computes with less precision than the reference where it is partitioned",
                  "a precision that recovers FP32 accuracy makes the check pass"),
    "reference-gap": ("bench_reference", "the candidate is slower than the reference",
                      "matching the reference's work closes the gap"),
    "redone-work": ("roofline", "work the trace shows repeated per call is redundant against the reference",
                    "removing the redundant work saves its share of FLOPs"),
    "gil": ("gil", "one thread is starved of the GIL while another runs",
            "releasing the GIL in the holding call lets the starved thread overlap it"),
}


class KernelDiagnostics:
    """The diagnosis of a kernel target's baseline: check and a trace first, then what they call for."""

    observe = ["check", "trace"]

    def __init__(self, probes: dict[str, Callable[[], Feedback]], knobs: dict[str, Knob]) -> None:
        self.probes, self.knobs = probes, knobs

    def pose(self, results: dict[str, Record]) -> list[Hypothesis]:
        """A question per probe the findings name: the check's failure, then every next_probes suggestion."""
        asked = ["precision"] if results.get("ladder/check", {}).get("verdict") == "fail" else []
        named = probes_in([text for r in results.values() for text in r.get("next_probes", [])])
        asked += [q for q, (probe, _, _) in QUESTIONS.items()
                  if q != "precision" and probe.split("_")[0] in named and probe in self.probes]
        if results.get("ladder/trace", {}).get("details", {}).get("redone"):
            asked.append("redone-work")
        return [Hypothesis(claim=QUESTIONS[q][1], spans=[], knobs=[], probe=QUESTIONS[q][0],
                           predicted=QUESTIONS[q][2], locality={"question": q}) for q in dict.fromkeys(asked)]

    def settle(self, probe: str, hypothesis: Hypothesis, results: dict[str, Record]) -> Hypothesis:
        """Supported with the claim the records support (and what it cites), refuted, or inconclusive."""
        record = results[f"ladder/{probe}"]
        question = hypothesis.locality["question"]
        found = SETTLE[question](results, self.knobs)
        if found is not None:
            settled = replace(found, key=hypothesis.key, locality={**found.locality, "question": question})
            return settled.settle("supported", f"ladder/{probe}", record["finding"])
        status = "inconclusive" if record["verdict"] == "inconclusive" else "refuted"
        return hypothesis.settle(status, f"ladder/{probe}", record["finding"])


def _precision_gap(results: dict[str, Record], knobs: dict[str, Knob]) -> Hypothesis | None:
    check = results.get("ladder/check")
    if not check or check["verdict"] != "fail":
        return None
    where = check.get("locality", {})
    partitioned = _number(check, "max_rel_err_partitioned")
    whole = _number(check, "max_rel_err")
    if "partition" in where and partitioned is not None and whole is not None and partitioned > whole:
        shards = where.get("shards") or [where.get("shard")]
        precision = likely_precision(partitioned)
        tags = ["precision", "partition"]
        trials = _number(check, "trials")
        over = f"{trials:g} trials" if trials is not None else "its trials"
        return Hypothesis(  # the numbers the check recorded (and states), worst over the same trials and shards
            claim=f"shard{'s' if len(shards) > 1 else ''} {', '.join(map(str, shards))} of {where['partition']} "
                  f"compute with {precision}: max rel err {partitioned:.1e} partitioned vs {whole:.1e} unpartitioned "
                  f"(the check's worst over {over}, each shard and the combined output)",
            spans=tags, knobs=_knobs_for(tags, knobs), probe="check",
            predicted=f"a precision that recovers FP32 accuracy brings the partitioned error near {whole:.1e}",
            evidence=[check["finding"]],
            cites={"ladder/check:numbers/max_rel_err_partitioned/value": partitioned,
                   "ladder/check:numbers/max_rel_err/value": whole})
    tags = ["correctness"]
    return Hypothesis(claim=f"the candidate is wrong: {check['finding']}", spans=tags, knobs=_knobs_for(tags, knobs),
                      probe="check", predicted="a fix makes check pass", evidence=[check["finding"]])


def _redone_work(results: dict[str, Record], knobs: dict[str, Knob]) -> Hypothesis | None:
    roof, trace = results.get("ladder/roofline"), results.get("ladder/trace")
    redundant = _number(roof, "redundant_flop_fraction") if roof else None
    if redundant is None or redundant < 0.05:
        return None
    cites = {"ladder/roofline:numbers/redundant_flop_fraction/value": redundant}
    parts, spans = [f"{redundant:.1%} of FLOPs are redundant against the reference"], []
    factor = _number(roof, "recompute_factor")
    if factor is not None:
        share = _number(roof, "recomputed_flop_fraction") or 0.0
        ops = [r["op"] for r in roof["details"].get("extra_work", []) if r["kind"] == "recomputed"]
        parts.append(f"ops recomputed {factor:g}x the reference's work: {', '.join(ops[:6])} ({share:.1%} of FLOPs)")
        cites["ladder/roofline:numbers/recompute_factor/value"] = factor
        cites["ladder/roofline:numbers/recomputed_flop_fraction/value"] = share
    inflated = [r for r in roof["details"].get("extra_work", []) if r["kind"] == "inflated"]
    if inflated:
        parts.append("padded or oversized work: " + ", ".join(f"{r['op']} {r['repeat']:.2f}x" for r in inflated[:3]))
    details = (trace or {}).get("details", {})
    redone = [r for r in details.get("repeats", []) if r["name"] in details.get("redone", [])]
    if redone:
        kinds: dict[str, str] = {}
        for r in roof["details"].get("extra_work", []):  # rows are roles; a span's ops are op names
            for op in r.get("ops") or [r["op"]]:
                kinds.setdefault(op, r["kind"])
        by_kind = {name: span_kind(details.get("span_ops", {}).get(name, {}), kinds) for name in
                   (r["name"] for r in redone)}
        parent, per_call = redone[0]["parent"], redone[0]["per_call"]
        again = [n for n, k in by_kind.items() if k == "recomputed"]
        bigger = [n for n, k in by_kind.items() if k == "inflated"]
        if again:
            dtypes = {row[2] for name in again for row in details.get("span_ops", {}).get(name, {}).values()}
            precision = "FP32 " if dtypes == {"float32"} else ""
            parts.insert(0, f"the {precision}work in {', '.join(again)} is redone in every {parent}: {per_call:g}x per "
                            "call where once would do")
        if bigger:
            parts.insert(len(again) > 0, f"{', '.join(bigger)} does more FLOPs than the reference's (padded)")
        spans = list(by_kind) + [parent]
        for r in redone:
            cites[f"ladder/trace:numbers/{r['name']}.per_call/value"] = r["per_call"]
    spans = spans or ["redundant-flops"]
    return Hypothesis(
        claim="; ".join(parts), spans=spans, knobs=_knobs_for(spans + ["redundant-flops"], knobs), probe="roofline",
        predicted=f"removing the redundant work saves up to {redundant:.0%} of FLOPs (more in time when the repeated "
                  "ops are small and dispatch-bound)",
        evidence=[roof["finding"]] + ([trace["finding"]] if trace else []), cites=cites)


def _gil_starvation(results: dict[str, Record], knobs: dict[str, Knob]) -> Hypothesis | None:
    trace, gil = results.get("ladder/trace"), results.get("ladder/gil")
    never = (trace or {}).get("details", {}).get("never_overlapping", [])
    starving = (gil or {}).get("locality", {})
    if "thread" not in starving:  # never overlapping alone is a question for the GIL probe, not an answer
        return None
    parts, cites, spans = [], {}, []
    if "thread" in starving:
        thread, span = starving["thread"], starving["span"]
        waited = _number(gil, f"{thread}.waited")
        parts.append(f"thread {thread} is starved of the GIL: waited {waited:.0f}% of its span time in {span}"
                     + (f" while {starving['holder']} held it in {starving['holder_span']}" if "holder" in starving else "")
                     + (f", mostly in {starving['holder_function']}" if "holder_function" in starving else ""))
        cites[f"ladder/gil:numbers/{thread}.waited/value"] = waited
        spans += [span, starving.get("holder_span", "")]
    if never:
        touched = {span for knob in knobs.values() for span in knob.touches}
        index = _working_pair(never, (trace or {}).get("details", {}).get("top_spans", []), touched)
        pair = never[index]
        executing = pair.get("executing_share_of_a")
        parts.append(f"{pair['a']} and {pair['b']} never overlap"
                     + (f" ({executing:.1%} of the waiting side's time ran alongside)" if executing is not None else ""))
        if executing is not None:
            cites[f"ladder/trace:details/never_overlapping/{index}/executing_share_of_a"] = executing
        spans += [pair["a"].split(" @ ")[0], pair["b"].split(" @ ")[0]]
    spans = [s for s in dict.fromkeys(spans) if s] + ["gil"]
    return Hypothesis(claim="; ".join(parts), spans=spans, knobs=_knobs_for(spans, knobs), probe="gil",
                      predicted="releasing the GIL in the native call lets the starved thread overlap it",
                      evidence=[r["finding"] for r in (trace, gil) if r], cites=cites)


def _working_pair(never: list[dict], top_spans: list[dict], touched: set[str] = frozenset()) -> int:
    """Which never-overlapping pair to name: first one whose spans a knob touches (a cause the loop can act
    on), then one whose spans were open at the same time yet never ran together (one side waited while the
    other ran: the starvation signature, unlike a pair that merely alternates); among those, the one whose
    span does the most work of its own (exclusive time in the trace's breakdown), so a leaf call (gemm) is
    named rather than a parent around it (step) that qualifies too; then the least overlap, then the
    analysis's order."""
    own = {row["key"]: row.get("exclusive_ns", 0) for row in top_spans}

    def rank(i: int) -> tuple:
        pair = never[i]
        names = [pair[side].split(" @ ")[0] for side in ("a", "b")]
        work = max(own.get(name, 0) for name in names)
        executing = pair.get("executing_share_of_a")
        acted_on = sum(name in touched for name in names)
        return -acted_on, pair.get("overlap_ns", 0) <= 0, -work, 1.0 if executing is None else executing, i

    return min(range(len(never)), key=rank)


def _reference_gap(results: dict[str, Record], knobs: dict[str, Knob]) -> Hypothesis | None:
    bench = results.get("ladder/bench_reference")
    ratio = _number(bench, "ratio") if bench else None
    if ratio is None or ratio <= 1.0 or bench["verdict"] != "fail":
        return None
    return Hypothesis(claim=f"the candidate takes {ratio:.3g}x the reference's time", spans=["time"],
                      knobs=[], probe="bench", predicted=f"at most {1 - 1 / ratio:.0%} less time by matching the "
                      "reference's work", evidence=[bench["finding"]],
                      cites={"ladder/bench_reference:numbers/ratio/value": ratio})


def span_kind(ops: dict[str, list[Any]], kinds: dict[str, str]) -> str:
    """recomputed | inflated | needed: where most of a span's FLOPs fall by the roofline's per-op verdicts."""
    total = sum(row[1] for row in ops.values())
    if total <= 0:
        return "needed"
    share = {kind: sum(row[1] for op, row in ops.items() if kinds.get(op) in group) / total
             for kind, group in (("recomputed", ("recomputed", "not in the reference")), ("inflated", ("inflated",)))}
    kind = max(share, key=share.get)
    return kind if share[kind] >= 0.5 else "needed"


SETTLE: dict[str, Callable[[dict[str, Record], dict[str, Knob]], Hypothesis | None]] = {
    "precision": _precision_gap, "reference-gap": _reference_gap, "redone-work": _redone_work,
    "gil": _gil_starvation}
