"""The optimization loop end to end on a tiny hybrid engine target: trace → hypotheses → proposals through
check, local A/B and (after a local win) end-to-end; every step in the ledger; budget; resume."""
from __future__ import annotations

import json

from infragent.agent.hypotheses import from_analysis
from infragent.agent.context import Budget
from infragent.agent.core import optimize
from infragent.agent.proposers.search import SearchProposer
from infragent.lab.ledger import Ledger
from infragent.lab.spec import Knob
from infragent.probes.feedback import Feedback
from server_fixture import TINY_HYBRID

SPEC = f"""
[target]
kind = "engine"
model = "hybrid"
serve_args = ["--hybrid-config", '{json.dumps(TINY_HYBRID)}', "--max-model-len", "512", "--kv-cache-gb", "0.05",
              "--threads", "1"]

[knobs.max_num_batched_tokens]
type = "int"
domain = [16, 256]
default = 16
touches = ["prefill", "kda", "mlp", "attention"]

[knobs.max_num_seqs]
type = "int"
domain = [1, 8]
default = 1
touches = ["decode"]

[[scenarios]]
name = "s"
num_prompts = 6
random_input_len = 96
random_output_len = 8
length_dist = "uniform"
random_range_ratio = 0.5
repeats = 2
goodput_ms = {{ ttft = 5000 }}

[[criteria]]
scenario = "s"
metric = "goodput"
min = 0.01

[[criteria]]
scenario = "s"
metric = "ttft_median_ms"
max_regression = 0.5
"""


def test_hypotheses_map_top_spans_to_the_knobs_that_touch_them():
    analysis = Feedback("analyze", "pass", "", details={
        "top_spans": [{"key": "mlp", "share": 0.5, "exclusive_ns": 5e8}, {"key": "sample", "share": 0.01,
                                                                           "exclusive_ns": 1e6}],
        "never_overlapping": [{"a": "kv.transfer @ kv-transfer", "b": "gemm @ MainThread", "overlap_ns": 0,
                               "a_busy_ns": 6e7}]})
    knobs = {"threads": Knob(type="int", domain=[1, 2], touches=["mlp"]),
             "seqs": Knob(type="int", domain=[1, 8], touches=["decode"])}
    found = from_analysis(analysis, knobs)
    assert [h.knobs for h in found] == [["threads"], []]
    assert found[0].probe == "local_ab" and "at most 50%" in found[0].predicted and found[1].probe == "gil"
    proposer = SearchProposer(knobs, suspects=["mlp"])
    assert list(proposer.knobs) == ["threads"]


def test_loop_runs_gates_in_order_records_everything_and_resumes(tmp_path):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    ledger = Ledger(tmp_path / "ledger.sqlite")
    lines: list[str] = []
    first = optimize(spec, ledger, Budget(probes=4, minutes=10), log=lines.append)  # trace, A/A, a trial
    keys = [r["key"] for r in ledger.probe_results(first.run_id)]
    assert keys == ["ladder/trace", "trial/0/check", "calibration/aa", "trial/0/local_ab"]
    hypotheses = ledger.hypotheses(first.run_id)
    assert hypotheses and all(h["key"].startswith("hypothesis/") for h in hypotheses)
    assert not any(r["probe"] in ("hypothesis", "trial") for r in ledger.probe_results(first.run_id))
    assert [c["trial"] for c in ledger.candidates(first.run_id)] == [0]
    checks = [r for r in ledger.probe_results(first.run_id) if r["key"].endswith("/check")]
    assert checks[0]["verdict"] == "pass"  # scheduling knobs do not change greedy outputs
    for r in ledger.probe_results(first.run_id):
        assert "cost_s" in r["feedback"]["details"], r["key"]
    assert any("budget" in limit for limit in first.limits)
    # resume with a larger budget: earlier trials are replayed, not re-run, and the run continues
    resumed = optimize(spec, ledger, Budget(probes=9, minutes=10), resume=first.run_id, log=lines.append)
    assert resumed.run_id == first.run_id and len(resumed.trials) > len(first.trials)
    after = [r["key"] for r in ledger.probe_results(first.run_id)]
    assert after[:len(keys)] == keys and after.count("trial/0/check") == 1
    assert ledger.run(first.run_id)["status"] == "completed"
    for result in ledger.candidates(first.run_id):
        assert result["records"] and all(k.startswith(f"trial/{result['trial']}/") for k in result["records"])
        if result["status"] == "measured":  # only after a real local win
            local = next(r for r in ledger.probe_results(first.run_id) if r["key"] == f"trial/{result['trial']}/local_ab")
            assert local["verdict"] == "pass"
