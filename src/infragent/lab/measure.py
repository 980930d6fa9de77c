"""A measure run: launch the spec's target, run every scenario's loadgen repeats, judge the absolute criteria,
and record each completed probe in the ledger as it finishes. A run killed part-way resumes where it stopped:
recorded probes are kept and skipped, and a target left behind by the crashed run is stopped by its group.
"""
from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Mapping

from infragent.analysis.serving_metrics import RequestRecord
from infragent.lab.criteria import Run, judge
from infragent.lab.ledger import Ledger
from infragent.lab.lifecycle import guarded_run, launched, open_run
from infragent.lab.spec import Scenario, Spec, load_spec
from infragent.probes.load_pairs import default_block, run_interleaved_sync
from infragent.probes.loadgen import LoadConfig, discover_model, fresh_seed, prompt_format, run_loadgen


def loadgen_config(scenario: Scenario, base_url: str, seed: int | None = None) -> LoadConfig:
    """One repeat of a scenario; prompts from seed (None: fresh ones, so no repeat hits a cache an earlier
    repeat or trial warmed)."""
    return LoadConfig(base_url=base_url, num_prompts=scenario.num_prompts, max_concurrency=scenario.max_concurrency,
                      request_rate=scenario.request_rate, burstiness=scenario.burstiness,
                      dataset_name=scenario.dataset_name, dataset_path=scenario.dataset_path,
                      random_input_len=scenario.random_input_len, random_output_len=scenario.random_output_len,
                      length_dist=scenario.length_dist, random_range_ratio=scenario.random_range_ratio,
                      goodput_ms=dict(scenario.goodput_ms), repeats=1, seed=seed, progress=False)


def interleaved_repeat(scenario: Scenario, base_urls: Mapping[str, str], seed: int,
                       block: int | None = None) -> dict[str, Run]:
    """One repeat of a scenario against every target at once, twin requests back to back (probes/load_pairs);
    seed orders the blocks; block: requests per interleaved block (default: one per concurrency slot). Every
    side gets the same prompts, fresh for this call: a server kept across trials (the baseline) never sees
    them twice, so neither side is served from a cache an earlier repeat warmed."""
    prompts = fresh_seed()
    configs = {name: loadgen_config(scenario, url, prompts) for name, url in base_urls.items()}
    models = {name: discover_model(config) for name, config in configs.items()}
    formats = {prompt_format(config, models[name])[0] for name, config in configs.items()}
    configs = {name: replace(config, prompt_format="text" if "text" in formats else "tokens")  # one workload
               for name, config in configs.items()}
    size = block or default_block(next(iter(configs.values())))
    runs = run_interleaved_sync(configs, models, seed=prompts, block=size, order_seed=seed)
    return {name: Run(run.records, run.duration_s, dict(scenario.goodput_ms) or None, size)
            for name, run in runs.items()}


def measure(spec_path: str | Path, ledger: Ledger, resume: int | None = None,
            log: Callable[[str], None] = print) -> int:
    """Run (or resume) a baseline measurement of the spec's target (its knobs at their defaults); return the
    run id. A target that dies mid-run fails the run (nothing it served after dying is recorded)."""
    spec = load_spec(spec_path)
    run_id = open_run(ledger, "measure", spec_path, resume, log)
    knobs = default_knobs(spec)
    with guarded_run(ledger, run_id, f"infragent measure {spec_path} --ledger {ledger.location}", log):
        done = ledger.completed_keys(run_id)
        experiment = ledger.experiment(run_id, "baseline", knobs)
        todo = [(s, r) for s in spec.scenarios for r in range(s.repeats) if f"{s.name}/{r}" not in done]
        log(f"run {run_id}: {len(done)} probes recorded, {len(todo)} to go")
        if todo:
            with launched(spec.target, knobs, ledger, run_id, "target") as target:
                for scenario, repeat in todo:
                    feedback = run_loadgen(loadgen_config(scenario, target.base_url))
                    target.check_alive()
                    ledger.record_probe(run_id, f"{scenario.name}/{repeat}", feedback.to_dict(), experiment,
                                        [(e.path, e.description) for e in feedback.evidence])
                    log(f"  {scenario.name}/{repeat}: {feedback.finding}")
        _judge_absolute(spec, ledger, run_id, log)
        ledger.set_run(run_id, status="completed")
    return run_id


def default_knobs(spec: Spec) -> dict:
    """The knob values a baseline runs with: each knob's default (knobs without one are left to the target)."""
    return {name: knob.default for name, knob in spec.knobs.items() if knob.default is not None}


def _judge_absolute(spec: Spec, ledger: Ledger, run_id: int, log: Callable[[str], None]) -> None:
    """Judge every absolute criterion on the recorded loadgen runs and record the judgements."""
    results = {r["key"]: r for r in ledger.probe_results(run_id)}
    for i, criterion in enumerate(spec.criteria):
        key = f"criterion/{i}"
        if criterion.max_regression is not None or key in results:
            continue  # relative criteria need a candidate (the agent loop); judged ones are kept
        scenario = next(s for s in spec.scenarios if s.name == criterion.scenario)
        runs = recorded_runs(ledger, run_id, scenario, results)
        judgements = judge(criterion, runs, bounds=tuple(scenario.buckets))
        verdict = ("fail" if any(j.verdict == "fail" for j in judgements)
                   else "pass" if all(j.verdict == "pass" for j in judgements) else "inconclusive")
        finding = "; ".join(j.message for j in judgements)
        ledger.record_probe(run_id, key, {"probe": "criterion", "verdict": verdict, "finding": finding, "numbers": {},
                                          "details": {"judgements": [asdict(j) for j in judgements]}})
        log(f"  criterion {i} [{criterion.metric}]: {verdict.upper()}: {finding}")


def recorded_runs(ledger: Ledger, run_id: int, scenario: Scenario, results: dict | None = None) -> list[Run]:
    """A scenario's loadgen repeats recorded in a measure run, back as Runs (from the stored raw records)."""
    results = results or {r["key"]: r for r in ledger.probe_results(run_id)}
    missing = [r for r in range(scenario.repeats) if f"{scenario.name}/{r}" not in results]
    if missing:
        raise ValueError(f"run {run_id}: scenario {scenario.name!r} has no recorded repeats {missing}; "
                         f"resume it with `infragent measure SPEC --resume {run_id}`")
    return [_as_run(ledger, results[f"{scenario.name}/{r}"], scenario) for r in range(scenario.repeats)]


def _as_run(ledger: Ledger, result: dict, scenario: Scenario) -> Run:
    """A recorded loadgen probe back as records (from the ledger's content-addressed copy of its evidence)."""
    sha = result["feedback"]["evidence"][0]["sha256"]
    data = json.loads(ledger.artifact_path(sha).read_text())["runs"][-1]
    return Run([RequestRecord(**r) for r in data["records"]], data["duration_s"], dict(scenario.goodput_ms) or None)
