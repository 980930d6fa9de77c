"""The serving gates, cheapest first: the spec's tests in the candidate's worktree, the step bench's unit, and
against live targets a correctness check, a short local A/B, and the end-to-end measurement with every
criterion judged. Each returns a Feedback the ledger keeps.
"""
from __future__ import annotations

import dataclasses
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import httpx
import numpy as np

from infragent.agent.hypotheses import engine_workload
from infragent.agent.workspace import run_limited
from infragent.analysis.blocks import (BlockEstimate, aa_floor, block_estimate, block_log_ratios, block_verdict,
                                      could_still_win, output_shortfall)
from infragent.analysis.serving_metrics import serving_metrics
from infragent.analysis.stats import bootstrap_median
from infragent.lab.criteria import REPEAT_TRIM, Judgement, Run, judge, judge_interval, twin_block_ratios
from infragent.lab.measure import interleaved_repeat
from infragent.lab.spec import QUALITY_METRICS, Scenario, Spec
from infragent.lab.target import engine_config
from infragent.probes.artifacts import save_json
from infragent.probes.feedback import Feedback, Measure
from infragent.probes.loadgen import LoadConfig, discover_model
from infragent.probes.step_bench import Unit

CHECK_PROMPTS = ("The capital of France is", "def fibonacci(n):", "Three things to pack for a hike:")
TESTS_TIMEOUT_S = 900.0

STEP_PROMPT_TOKENS = 32  # 2 x 32-token prompts x 4 tokens: half the time per round of 2 x 64 x 8, about as
STEP_OUTPUT_TOKENS = 4  # precise per second of bench, and clear cases stop at the first look (docs/BENCHMARKS.md)


def step_unit(spec: Spec) -> Unit:
    """The step bench's batch: two of the first scenario's prompts (cut to STEP_PROMPT_TOKENS), run to
    STEP_OUTPUT_TOKENS tokens each — a prefill step and decode steps of the scenario's kind, a few tenths of
    a second per unit."""
    scenario = spec.scenarios[0]
    prompts = [ids[:STEP_PROMPT_TOKENS] for ids, _ in engine_workload(spec, {}, prompts=2, seed=11)]
    return Unit(prompts, min(scenario.random_output_len, STEP_OUTPUT_TOKENS))


def run_tests(command: str, worktree: Path, kind: str) -> Feedback:
    """The spec's test command in the candidate's worktree (bash -c, with this interpreter's folder first on the
    PATH, so `python` is the one running infragent; for an engine target with src/ on the PYTHONPATH): pass on
    exit status 0."""
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    if kind == "engine" and (worktree / "src").is_dir():
        env["PYTHONPATH"] = os.pathsep.join([str(worktree / "src")] + ([os.environ["PYTHONPATH"]]
                                                                       if os.environ.get("PYTHONPATH") else []))
    done = run_limited(["bash", "-c", command], cwd=worktree, timeout_s=TESTS_TIMEOUT_S, memory_gb=None, env=env)
    tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
    status = f"timed out after {TESTS_TIMEOUT_S:g} s" if done.timed_out else f"exit {done.rc}"
    return Feedback("tests", "pass" if done.rc == 0 else "fail", f"`{command}`: {status} in {done.seconds:.1f} s"
                    + (f": {' | '.join(tail)}" if tail else ""), numbers={"rc": Measure(done.rc)},
                    details={"stdout_tail": done.stdout[-3000:], "stderr_tail": done.stderr[-3000:]})


def check_outputs(baseline_url: str, candidate_url: str, max_tokens: int = 8) -> Feedback:
    """Greedy completions of fixed prompts, one at a time, must be identical on candidate and baseline."""
    mismatches = []
    models = {url: discover_model(LoadConfig(base_url=url)) for url in (baseline_url, candidate_url)}
    for prompt in CHECK_PROMPTS:
        texts = []
        for url in (baseline_url, candidate_url):
            body = {"model": models[url], "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
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
    (weights fp32 and unquantized, fp32 KV), both in-process: perplexity, KL and greedy agreement with CIs."""
    from infragent.engine.config import ConfigError
    from infragent.engine.llm_engine import LLMEngine
    from infragent.probes.quality import quality, untimed_threads

    engines: list[LLMEngine] = []
    try:
        candidate = engine_config(spec.target, knobs)
        reference = dataclasses.replace(candidate, dtype="float32", gemm="torch", kv_cache_dtype="auto",
                                        kv_cache_dtypes=None, quantization=None, smoothquant_alpha=None,
                                        weight_format="fp32", speculative=None, tensor_parallel_size=1,
                                        pipeline_parallel_size=1)
        with untimed_threads([reference, candidate]) as (configs, note):
            for config in configs:
                engines.append(LLMEngine(config))
            feedback = quality(*engines, plan, label=f"knobs {knobs}")
        feedback.finding += note
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


LOCAL_BLOCKS = 6  # blocks per look; a second look adds as many when the first cannot decide
LOCAL_CONFIDENCE = 0.975  # per look, two looks at most: a false win stays under 2.5% (Bonferroni)
LOCAL_OUTPUT_LEN = 16  # the local A/B is a cheap proxy: the scenario's requests, outputs cut to this many tokens


def local_block(scenario: Scenario) -> int:
    """Requests per local A/B block: one per concurrency slot (2 when the scenario sets no limit)."""
    return scenario.max_concurrency or 2


def local_metric(scenario: Scenario) -> str:
    """What a local A/B block compares, as the objective counts it: under SLOs (goodput) each request's latency;
    without them (output tokens/s) the block's makespan, since a larger batch can finish a block of requests
    sooner while each request takes as long (analysis/blocks.block_log_ratios)."""
    return "latency" if scenario.goodput_ms else "makespan"


LOCAL_METRIC_WORDS = {"latency": "E2E latency per output token", "makespan": "block makespan per output token"}


def block_ratios(scenario: Scenario, baseline_url: str, candidate_url: str, seed: int,
                 blocks: int) -> tuple[list[float], dict[str, Run]]:
    """blocks interleaved blocks of the scenario's requests (fresh prompts from seed; outputs capped at
    LOCAL_OUTPUT_LEN tokens): per-block log ratios candidate/baseline of the time per output token by
    local_metric, and both sides' runs."""
    size = local_block(scenario)
    small = scenario.model_copy(update={"num_prompts": blocks * size, "repeats": 1,
                                        "random_output_len": min(scenario.random_output_len, LOCAL_OUTPUT_LEN)})
    runs = interleaved_repeat(small, {"baseline": baseline_url, "candidate": candidate_url}, seed, block=size)
    metric = local_metric(scenario)
    return block_log_ratios(runs["baseline"].records, runs["candidate"].records, size, metric), runs


def local_ab(scenario: Scenario, baseline_url: str, candidate_url: str, seed: int, floor: float,
             blocks: int = LOCAL_BLOCKS) -> Feedback:
    """A short A/B, block by block, judged over blocks (analysis/blocks.py): pass = a win (the interval of
    the time-per-token ratio by local_metric lies wholly below the A/A floor, analysis/blocks.block_verdict),
    fail = a loss the same way round, inconclusive otherwise. When the first look cannot decide but could still show
    a win, a second look with as many fresh blocks is pooled with it."""
    ratios, runs = block_ratios(scenario, baseline_url, candidate_url, seed, blocks)
    estimate = block_estimate(ratios, LOCAL_CONFIDENCE)
    looks = 1
    if block_verdict(estimate, floor) == "inconclusive" and could_still_win(estimate, floor):
        more, more_runs = block_ratios(scenario, baseline_url, candidate_url, seed + 500_000, blocks)
        ratios, looks = ratios + more, 2
        estimate = block_estimate(ratios, LOCAL_CONFIDENCE)
        runs = {side: Run(runs[side].records + more_runs[side].records, runs[side].duration_s
                          + more_runs[side].duration_s, runs[side].slos_ms) for side in runs}
    outcome = block_verdict(estimate, floor)
    obj_b, obj_c = objective(runs["baseline"]), objective(runs["candidate"])
    if (outcome, obj_c < obj_b) in (("win", True), ("loss", False)):  # the blocks and the objective disagree
        outcome = "inconclusive"
    numbers = {"block_ratio": Measure(estimate.ratio, "x", estimate.lo, estimate.hi, estimate.blocks),
               "aa_floor": Measure(floor, "log"), "objective_baseline": Measure(obj_b),
               "objective_candidate": Measure(obj_c)}
    change = f"{abs(estimate.ratio - 1):.1%} {'faster' if estimate.ratio < 1 else 'slower'}"
    cut = shortfall_note({side: run.records for side, run in runs.items()})
    finding = (f"{LOCAL_METRIC_WORDS[local_metric(scenario)]} x{estimate.ratio:.3f} [{estimate.lo:.3f}, "
               f"{estimate.hi:.3f}] candidate/baseline ({change}) over {estimate.blocks} blocks of "
               f"{local_block(scenario)} requests, "
               f"{LOCAL_CONFIDENCE:.1%} CI; A/A floor: a win needs the whole interval below x{math.exp(-floor):.3f}, "
               f"a loss above x{math.exp(floor):.3f}; objective {obj_c:.3g} vs {obj_b:.3g}: "
               + {"win": "a real local win", "loss": "a real local loss",
                  "inconclusive": "inconclusive (no effect beyond the A/A floor that the blocks can show)"}[outcome]
               + (f" ({cut}: compared per token delivered)" if cut else ""))
    verdict = {"win": "pass", "loss": "fail", "inconclusive": "inconclusive"}[outcome]
    return Feedback("local_ab", verdict, finding, numbers=numbers,
                    details={"outcome": outcome, "metric": local_metric(scenario), "log_ratios": ratios,
                             "looks": looks, "block": local_block(scenario), "confidence": LOCAL_CONFIDENCE})


def shortfall_note(records: dict[str, list], why: str = "") -> str:
    """Which side's requests got fewer tokens than they asked for (more than 5% short), or ""."""
    return "; ".join(f"the {side}'s requests got {1 - gap:.0%} of the tokens asked{why}"
                     for side, gap in ((s, output_shortfall(r)) for s, r in records.items()) if gap > 0.05)


def aa_calibration(scenario: Scenario, baseline_url: str, twin_url: str, seed: int,
                   blocks: int = LOCAL_BLOCKS + 2) -> Feedback:
    """The A/A floor on this machine: the local A/B between two launches of the baseline; the floor is
    MIN_FLOOR, or its outer bound where it shows a bias (analysis/blocks.aa_floor)."""
    ratios, runs = block_ratios(scenario, baseline_url, twin_url, seed, blocks)
    failed = [r for run in runs.values() for r in run.records if not r.success and not r.warmup]
    if failed and not any(r.success and not r.warmup for run in runs.values() for r in run.records):
        return Feedback("calibration", "fail", f"A/A: every request failed ({len(failed)}): {failed[0].error}",
                        numbers={}, details={"log_ratios": ratios, "errors": [r.error for r in failed[:5]]})
    estimate = block_estimate(ratios, LOCAL_CONFIDENCE)
    floor = aa_floor(estimate)
    finding = (f"A/A: two launches of the baseline differ by x{estimate.ratio:.3f} [{estimate.lo:.3f}, "
               f"{estimate.hi:.3f}] in {LOCAL_METRIC_WORDS[local_metric(scenario)]} over {estimate.blocks} blocks; "
               f"a local win needs its whole interval below x{math.exp(-floor):.3f} "
               f"(a loss above x{math.exp(floor):.3f})")
    return Feedback("calibration", "pass" if math.isfinite(floor) else "inconclusive", finding,
                    numbers={"aa_floor": Measure(floor, "log"),
                             "aa_ratio": Measure(estimate.ratio, "x", estimate.lo, estimate.hi, estimate.blocks)},
                    details={"log_ratios": ratios, "confidence": LOCAL_CONFIDENCE})


OUTPUT_AGREEMENT = 0.9  # greedy outputs identical on at least this share of twin requests (batching may flip a few)


def end_to_end(spec: Spec, baseline_url: str, candidate_url: str, repeats_offset: int = 0,
               more: Callable[[], bool] = lambda: False, alive: Callable[[], None] = lambda: None,
               same_outputs: bool = True, floor: float | None = None) -> tuple[Feedback, dict, dict[str, Feedback]]:
    """Every scenario's repeats, interleaved with the baseline; every criterion judged per phase and bucket.
    While a criterion is inconclusive and none fails, one more repeat of every scenario is run as long as
    more() allows (the budget), up to twice the scenario's repeats. alive() raises when a target died.
    same_outputs: the candidate's greedy outputs must match the baseline's on twin requests (at least
    OUTPUT_AGREEMENT of them); off where outputs may differ by design (quality criteria judge those).
    floor: the A/A floor (log); when given (for a patch), a candidate is kept only if it also improves the
    objective beyond it — the CI of the objective ratio (candidate/baseline, per twin block or twin repeat) lies
    above exp(floor) — so a code change that passes every criterion but makes nothing better is not kept.

    Returns the verdict, the objective for the proposer, and per scenario and side a loadgen-shaped
    Feedback whose evidence holds the raw records (what the report draws)."""
    runs: dict[str, dict[str, list[Run]]] = {s.name: {"baseline": [], "candidate": []} for s in spec.scenarios}

    def repeat_all(repeat: int, extra: bool = False) -> None:
        for scenario in (s for s in spec.scenarios if extra or repeat < s.repeats):
            pair = interleaved_repeat(scenario, {"baseline": baseline_url, "candidate": candidate_url},
                                      repeats_offset + repeat)
            alive()
            for side, run in pair.items():
                runs[scenario.name][side].append(run)

    repeats = max(s.repeats for s in spec.scenarios)
    for repeat in range(repeats):
        repeat_all(repeat)
    first = spec.scenarios[0].name

    def gain() -> tuple[BlockEstimate, str]:  # the objective, candidate/baseline, over twins of the first scenario
        sides = runs[first]["baseline"], runs[first]["candidate"]
        blocks = [] if spec.scenarios[0].goodput_ms else twin_block_ratios(*sides)
        if blocks:  # output throughput: per block, as its criterion is judged (lab/criteria.twin_block_ratios)
            return block_estimate([-x for x in blocks], 0.95, trim=REPEAT_TRIM), "twin blocks"
        values = [objective(r) for r in sides[0]], [objective(r) for r in sides[1]]
        return block_estimate([math.log(max(cv, 1e-9) / max(bv, 1e-9)) for bv, cv in zip(*values)], 0.95), "twin repeats"

    def undecided(judgements: list[Judgement]) -> bool:
        if any(j.verdict == "fail" for j in judgements):
            return False
        g = gain()[0]
        may_improve = floor is not None and not g.lo > math.exp(floor) and g.hi > math.exp(floor)
        return any(j.verdict == "inconclusive" for j in judgements) or may_improve

    judgements = _judge_all(spec, runs)
    extra = 0
    while undecided(judgements) and extra < repeats and more():
        repeat_all(repeats + extra, extra=True)
        extra += 1
        judgements = _judge_all(spec, runs)
    values = {side: [objective(r) for r in runs[first][side]] for side in ("baseline", "candidate")}
    b, c = bootstrap_median(values["baseline"]), bootstrap_median(values["candidate"])
    agreement, compared = output_agreement(runs)
    wrong = same_outputs and compared > 0 and agreement < OUTPUT_AGREEMENT
    gain_, twins = gain()
    cut = shortfall_note({side: [r for run in runs[first][side] for r in run.records]
                          for side in ("baseline", "candidate")}, " (its latencies are of less work)")
    flat = floor is not None and not gain_.lo > math.exp(floor)
    failed = [j for j in judgements if j.verdict == "fail"]
    unsure = [j for j in judgements if j.verdict == "inconclusive"]
    verdict = "fail" if failed or wrong else "inconclusive" if unsure or flat else "pass"
    finding = (f"objective {c.fmt(3)} vs baseline {b.fmt(3)} ({first}); "
               + (f"greedy outputs differ from the baseline's on {1 - agreement:.0%} of {compared} twin requests; "
                  if wrong else "")
               + (f"no improvement beyond the A/A floor (objective x{gain_.ratio:.3f} [{gain_.lo:.3f}, {gain_.hi:.3f}] "
                  f"over {gain_.blocks} {twins}; a kept change needs x>{math.exp(floor):.3f}); " if flat else "")
               + (f"{len(failed)} criteria fail: {failed[0].message}" if failed else
                  f"{len(unsure)} inconclusive: {unsure[0].message}" if unsure else
                  f"all {len(judgements)} criteria pass")
               + (f" (after {extra} extra repeat{'s' if extra > 1 else ''} to decide)" if extra else "")
               + (f"; {cut}" if cut else ""))
    feedback = Feedback("end_to_end", verdict, finding,
                        numbers={"objective_baseline": Measure(b.median, "", b.lo, b.hi, len(values["baseline"])),
                                 "objective_candidate": Measure(c.median, "", c.lo, c.hi, len(values["candidate"])),
                                 "output_agreement": Measure(agreement, "share", n=compared),
                                 "objective_ratio": Measure(gain_.ratio, "x", gain_.lo, gain_.hi, gain_.blocks)},
                        details={"judgements": [asdict(j) for j in judgements], "objective_samples": values})
    raw = {f"{name}/{side}": _as_loadgen(scenario_of(spec, name), sides[side], side)
           for name, sides in runs.items() for side in sides}
    feasible = not failed and not unsure and not wrong and not flat
    return feedback, {"objective": float(np.median(values["candidate"])), "objective_ratio": gain_.ratio,
                      "feasible": feasible}, raw


def output_agreement(runs: dict[str, dict[str, list[Run]]]) -> tuple[float, int]:
    """(share of twin requests — same scenario, repeat and index — whose generated text is identical on both
    sides, how many were compared). Twins that delivered different numbers of tokens (a server that cut one
    short) hold different amounts of text and are not compared."""
    same = compared = 0
    for sides in runs.values():
        for base, cand in zip(sides["baseline"], sides["candidate"]):
            theirs = {r.index: r for r in cand.records if r.success and not r.warmup and r.output_digest}
            for r in base.records:
                twin = theirs.get(r.index)
                if r.success and not r.warmup and r.output_digest and twin and twin.output_tokens == r.output_tokens:
                    compared += 1
                    same += twin.output_digest == r.output_digest
    return (same / compared if compared else float("nan")), compared


def _judge_all(spec: Spec, runs: dict[str, dict[str, list[Run]]]) -> list[Judgement]:
    judgements: list[Judgement] = []
    for criterion in spec.criteria:
        if criterion.metric in QUALITY_METRICS:
            continue
        scenario = scenario_of(spec, criterion.scenario)
        sides = runs[scenario.name]
        judgements += judge(criterion, sides["candidate"], sides["baseline"], bounds=tuple(scenario.buckets))
    return judgements


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
