"""The loop's probes against live targets, cheapest first: a correctness check, a short local A/B, and the
end-to-end measurement with every criterion judged. Each returns a Feedback the ledger keeps.
"""
from __future__ import annotations

import dataclasses
from dataclasses import asdict

import httpx
import numpy as np

from infragent.analysis.serving_metrics import serving_metrics
from infragent.analysis.stats import bootstrap_median
from infragent.lab.criteria import Judgement, Run, judge, judge_interval
from infragent.lab.measure import interleaved_repeat
from infragent.lab.spec import QUALITY_METRICS, Scenario, Spec
from infragent.lab.target import engine_config
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure

CHECK_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Three things to pack for a hike:")


def check_outputs(baseline_url: str, candidate_url: str, max_tokens: int = 8) -> Feedback:
    """Greedy completions of fixed prompts, one at a time, must be identical on candidate and baseline."""
    mismatches = []
    for prompt in CHECK_PROMPTS:
        texts = []
        for url in (baseline_url, candidate_url):
            body = {"model": "any", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
            response = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
            response.raise_for_status()
            texts.append(response.json()["choices"][0]["text"])
        if texts[0] != texts[1]:
            mismatches.append({"prompt": prompt, "baseline": texts[0], "candidate": texts[1]})
    verdict = "fail" if mismatches else "pass"
    finding = (f"greedy outputs differ on {len(mismatches)}/{len(CHECK_PROMPTS)} prompts (first: "
               f"{mismatches[0]['prompt']!r})" if mismatches else f"greedy outputs identical on {len(CHECK_PROMPTS)} prompts")
    return Feedback("check", verdict, finding, numbers={"mismatches": Measure(len(mismatches))},
                    details={"mismatches": mismatches})


def quality_gate(spec: Spec, knobs: dict, plan=None) -> Feedback:  # noqa: ANN001 (QualityPlan, imported lazily)
    """The spec's quality criteria for an engine with these knobs, against an fp32 copy of that engine
    (no quantized weights, fp32 KV), both in-process: perplexity, KL and greedy agreement with CIs."""
    from infragent.engine.config import ConfigError
    from infragent.engine.llm_engine import LLMEngine
    from infragent.probes.quality import quality

    engines: list[LLMEngine] = []
    try:
        candidate = engine_config(spec.target, knobs)
        reference = dataclasses.replace(candidate, dtype="float32", gemm="torch", kv_cache_dtype="auto",
                                        kv_cache_dtypes=None, quantization=None, smoothquant_alpha=None,
                                        speculative=None, tensor_parallel_size=1, pipeline_parallel_size=1)
        for config in (reference, candidate):
            engines.append(LLMEngine(config))
        feedback = quality(*engines, plan, label=f"knobs {knobs}")
    except ConfigError as err:
        return Feedback("quality", "fail", f"knobs {knobs}: the engine cannot run them: {err}")
    finally:
        for engine in engines:
            engine.close()
    judgements = [judge_interval(c, m.value, m.ci_low, m.ci_high, "quality")
                  for c in spec.criteria if c.metric in QUALITY_METRICS
                  for m in [feedback.numbers[c.metric]]]
    failed = [j for j in judgements if j.verdict == "fail"]
    unsure = [j for j in judgements if j.verdict == "inconclusive"]
    feedback.verdict = "fail" if failed else "inconclusive" if unsure else "pass"
    feedback.finding += "; " + "; ".join(j.message for j in failed + unsure or judgements)
    feedback.details["judgements"] = [asdict(j) for j in judgements]
    return feedback


def objective(run: Run) -> float:
    """What the search maximizes: goodput under the scenario's SLOs, or output tokens/s without SLOs."""
    m = serving_metrics(run.records, run.duration_s, run.slos_ms)
    return m.goodput if m.goodput is not None else m.output_throughput


def local_ab(scenario: Scenario, baseline_url: str, candidate_url: str, seed: int, prompts: int = 6) -> Feedback:
    """A short interleaved run: objective of each side and the paired per-request E2E latency ratio.

    The local win is real when the candidate's objective is not lower and the 95% CI of the median paired
    latency ratio lies below 1 (or the objective is higher by at least one request's worth).
    """
    small = scenario.model_copy(update={"num_prompts": min(prompts, scenario.num_prompts), "repeats": 1})
    runs = interleaved_repeat(small, {"baseline": baseline_url, "candidate": candidate_url}, seed)
    base, cand = runs["baseline"], runs["candidate"]
    twins = {r.index: r for r in base.records if r.success and not r.warmup}
    ratios = [r.latency_s / twins[r.index].latency_s for r in cand.records
              if r.success and not r.warmup and r.index in twins and twins[r.index].latency_s > 0]
    ratio = bootstrap_median(ratios, seed=seed) if ratios else None
    obj_b, obj_c = objective(base), objective(cand)
    faster = ratio is not None and ratio.hi < 1.0
    win = obj_c >= obj_b and (faster or obj_c > obj_b + 1.0 / max(base.duration_s, 1e-9))
    numbers = {"objective_baseline": Measure(obj_b), "objective_candidate": Measure(obj_c)}
    if ratio is not None:
        numbers["e2el_ratio"] = Measure(ratio.median, "x", ratio.lo, ratio.hi, len(ratios))
    finding = (f"objective {obj_c:.3g} vs {obj_b:.3g} (baseline); E2E latency x"
               f"{ratio.fmt(3) if ratio else 'n/a'} over {len(ratios)} paired requests: "
               + ("a real local win" if win else "no real local win"))
    return Feedback("local_ab", "pass" if win else "fail", finding, numbers=numbers,
                    details={"prompts": small.num_prompts})


def end_to_end(spec: Spec, baseline_url: str, candidate_url: str,
               repeats_offset: int = 0) -> tuple[Feedback, dict, dict[str, Feedback]]:
    """Every scenario's repeats, interleaved with the baseline; every criterion judged per phase and bucket.

    Returns the verdict, the objective for the proposer, and per scenario and side a loadgen-shaped
    Feedback whose evidence holds the raw records (what the report draws)."""
    runs: dict[str, dict[str, list[Run]]] = {}
    for scenario in spec.scenarios:
        sides: dict[str, list[Run]] = {"baseline": [], "candidate": []}
        for repeat in range(scenario.repeats):
            pair = interleaved_repeat(scenario, {"baseline": baseline_url, "candidate": candidate_url},
                                      repeats_offset + repeat)
            for side, run in pair.items():
                sides[side].append(run)
        runs[scenario.name] = sides
    judgements: list[Judgement] = []
    for criterion in spec.criteria:
        scenario = next(s for s in spec.scenarios if s.name == criterion.scenario)
        sides = runs[scenario.name]
        judgements += judge(criterion, sides["candidate"], sides["baseline"], bounds=tuple(scenario.buckets))
    first = spec.scenarios[0].name
    values = {side: [objective(r) for r in runs[first][side]] for side in ("baseline", "candidate")}
    b, c = bootstrap_median(values["baseline"]), bootstrap_median(values["candidate"])
    failed = [j for j in judgements if j.verdict == "fail"]
    unsure = [j for j in judgements if j.verdict == "inconclusive"]
    verdict = "fail" if failed else "inconclusive" if unsure else "pass"
    finding = (f"objective {c.fmt(3)} vs baseline {b.fmt(3)} ({first}); "
               + (f"{len(failed)} criteria fail: {failed[0].message}" if failed else
                  f"{len(unsure)} inconclusive" if unsure else f"all {len(judgements)} criteria pass"))
    feedback = Feedback("end_to_end", verdict, finding,
                        numbers={"objective_baseline": Measure(b.median, "", b.lo, b.hi, len(values["baseline"])),
                                 "objective_candidate": Measure(c.median, "", c.lo, c.hi, len(values["candidate"]))},
                        details={"judgements": [asdict(j) for j in judgements], "objective_samples": values})
    raw = {f"{name}/{side}": _as_loadgen(scenario_of(spec, name), sides[side], side)
           for name, sides in runs.items() for side in sides}
    return feedback, {"objective": float(np.median(values["candidate"])), "feasible": not failed and not unsure}, raw


def scenario_of(spec: Spec, name: str) -> Scenario:
    """The scenario with this name."""
    return next(s for s in spec.scenarios if s.name == name)


def _as_loadgen(scenario: Scenario, runs: list[Run], side: str) -> Feedback:
    """Repeats of one side in loadgen's evidence format (config, runs with metrics and raw records)."""
    result = {"config": {"request_rate": scenario.request_rate, "scenario": scenario.name, "side": side},
              "runs": [{"duration_s": r.duration_s,
                        "metrics": asdict(serving_metrics(r.records, r.duration_s, r.slos_ms)),
                        "records": [asdict(rec) for rec in r.records]} for r in runs]}
    evidence = save_json("loadgen", result, f"{scenario.name} {side}: raw per-request records")
    outputs = [serving_metrics(r.records, r.duration_s, r.slos_ms).output_throughput for r in runs]
    return Feedback("loadgen", "pass", f"{side}: {len(runs)} repeats of {scenario.name}, median output "
                    f"{float(np.median(outputs)):.1f} tok/s", evidence=[evidence])
