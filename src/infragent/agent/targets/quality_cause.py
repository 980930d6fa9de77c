"""Which change a failed quality gate is about. A candidate that changes the engine's numerics (quantized
weights, a KV-cache format, precision) and fails a quality gate poses, for each such change, "the loss comes
from KNOB = VALUE"; the quality gate on that change alone (the baseline's knobs otherwise) settles them one
at a time, until one fails by itself. A candidate with one such change needs no extra probe: its own gate
already names the cause. Once a value is known to cost quality, a later candidate with it is rejected
without another gate run.
"""
from __future__ import annotations

import time
from typing import Any

from infragent.agent.context import RunContext
from infragent.agent.hypotheses import Hypothesis
from infragent.agent.targets.serving_gates import quality_gate
from infragent.agent.targets import Candidate
from infragent.lab.spec import Spec

# the EngineConfig fields that change what the engine computes (the quality reference resets them), widest
# reach first: quantized weights and activations touch every matmul, a KV format only attention's inputs
NUMERICS_KNOBS = ("quantization", "smoothquant_alpha", "kv_cache_dtype", "kv_cache_dtypes", "dtype", "gemm",
                  "tp_partial_precision", "tensor_parallel_size", "pipeline_parallel_size", "speculative")


def quality_causes(ctx: RunContext, spec: Spec, baseline_knobs: dict[str, Any], candidate: Candidate,
                   gate: dict) -> list[Hypothesis]:
    """The hypotheses a failed gate poses about the candidate's numerics changes, each settled by a gate run
    on that change alone (or by the candidate's own gate when it made one change); [] when the gate passed."""
    failed = [j for j in gate["feedback"]["details"].get("judgements", []) if j["verdict"] == "fail"]
    changed = [k for k in NUMERICS_KNOBS if k in candidate.knobs and candidate.knobs[k] != baseline_knobs.get(k)]
    known = {h["locality"].get("question") for h in ctx.ledger.hypotheses(ctx.run_id) if h["status"] == "supported"}
    if not failed or not changed or any(_question(k, candidate.knobs[k]) in known for k in changed):
        return []  # passed, nothing numeric changed, or a change already known to cost quality explains it
    metrics = ", ".join(f"{j['metric']} {j['value']:.4g}" + (f" (limit {j['limit']:g})" if j.get("limit") is not None
                                                               else "") for j in failed)
    found = []
    for knob in changed:
        value = candidate.knobs[knob]
        h = Hypothesis(claim=f"{knob} = {value!r} costs quality on this model: {metrics} with it",
                       spans=[], knobs=[knob], probe="quality",
                       predicted=f"the quality gate fails with {knob} = {value!r} alone",
                       locality={"question": _question(knob, value)},
                       evidence=[f"{gate['key']}: {gate['feedback']['finding'][:300]}"])
        if len(changed) == 1:
            record = gate
        elif ctx.probes_left():
            started = time.monotonic()
            record = ctx.record(f"{candidate.key}/quality/{knob}",
                                quality_gate(spec, {**baseline_knobs, knob: value}), candidate.experiment, started)
        else:
            found.append(h)  # no budget to isolate it: it stays open
            continue
        status = {"fail": "supported", "pass": "refuted"}.get(record["verdict"], "inconclusive")
        numbers = record["feedback"].get("numbers", {})
        h.cites = {f"{record['key']}:numbers/{j['metric']}/value": numbers[j["metric"]]["value"]
                   for j in failed if j["metric"] in numbers}
        found.append(h.settle(status, record["key"], record["feedback"]["finding"][:400]))
        if status == "supported":
            break
    return found


def known_quality_cost(ctx: RunContext, knobs: dict[str, Any]) -> str | None:
    """The supported hypothesis (key and claim) that says one of these knob values alone fails the quality
    gates: a candidate with it is rejected without another gate run; None when there is none."""
    asked = {_question(k, v) for k, v in knobs.items() if k in NUMERICS_KNOBS}
    return next((f"{h['key']}: {h['claim']}" for h in ctx.ledger.hypotheses(ctx.run_id)
                 if h["status"] == "supported" and h["locality"].get("question") in asked), None)


def _question(knob: str, value: Any) -> str:
    return f"quality:{knob}={value}"
