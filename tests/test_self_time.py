"""Time in no child span: a parent whose children leave a large share of its time uncovered is a finding, with
the code range its `with span(...)` block covers, and a hypothesis of its own."""
from __future__ import annotations

import json
from pathlib import Path

from infragent.agent.hypotheses import from_analysis
from infragent.analysis.self_time import code_range, self_time
from infragent.analysis.trace_load import load_columns
from infragent.probes.analyze import analyze
from infragent.analysis.idle import NO_SPAN, own_time
from infragent.probes.step_bench import shift_feedback


def _trace(tmp_path: Path) -> Path:
    """Ten steps of 100 µs: 'mlp' 45 and 'attention' 35 inside each, 20 in the step itself (a planted sleep); a
    'load' span whose one child covers it all."""
    events = []
    for i in range(10):
        t = i * 200
        events += [{"ph": "X", "name": "step", "ts": t, "dur": 100, "pid": 1, "tid": 1, "cat": "span"},
                   {"ph": "X", "name": "mlp", "ts": t + 5, "dur": 45, "pid": 1, "tid": 1, "cat": "span"},
                   {"ph": "X", "name": "attention", "ts": t + 60, "dur": 35, "pid": 1, "tid": 1, "cat": "span"},
                   {"ph": "X", "name": "load", "ts": t + 100, "dur": 100, "pid": 1, "tid": 1, "cat": "span"},
                   {"ph": "X", "name": "read", "ts": t + 100, "dur": 100, "pid": 1, "tid": 1, "cat": "span"}]
    path = tmp_path / "steps.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_a_parent_s_own_time_is_found_with_its_share_and_children(tmp_path: Path) -> None:
    found = self_time(load_columns(_trace(tmp_path)))
    assert [s.span for s in found] == ["step"]  # 'load' is covered by 'read': no own time
    step = found[0]
    assert step.self_ns == 10 * 20_000 and step.inclusive_ns == 10 * 100_000
    assert abs(step.share - 0.10) < 1e-9 and step.children == ["mlp", "attention"]
    assert self_time(load_columns(_trace(tmp_path)), min_share=0.11) == []


def test_analyze_says_it_and_the_hypothesis_names_the_span(tmp_path: Path) -> None:
    fb = analyze(_trace(tmp_path))
    said = [f for f in fb.finding.split("; ") if "no child span" in f]
    assert any("time in no child span: 'step' holds 10%" in f and "'mlp', 'attention'" in f for f in said), fb.finding
    hypotheses = from_analysis(fb, {})
    own = [h for h in hypotheses if "in no child span" in h.claim]
    assert len(own) == 1 and own[0].spans == ["step"] and own[0].probe == "roofline", [h.claim for h in hypotheses]


def test_code_range_finds_each_with_span_block(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "engine.py").write_text(
        "from infragent.trace import span\n"
        "import time\n\n"
        "def step():\n"
        "    with span('step'):\n"
        "        with span(\"mlp\"):\n"
        "            pass\n"
        "        time.sleep(0.004)\n"
        "\n"
        "def other():\n"
        "    with trace.span('step', n=1):\n"
        "        pass\n")
    (tmp_path / "pkg" / "broken.py").write_text("with span('step'):\n  (\n")  # does not parse: skipped
    assert code_range("step", tmp_path) == ["pkg/engine.py:5-8", "pkg/engine.py:11-12"]
    assert code_range("mlp", tmp_path) == ["pkg/engine.py:6-7"]
    assert code_range("absent", tmp_path) == []


def test_the_span_table_lists_top_spans_and_own_time_with_code(tmp_path: Path) -> None:
    from infragent.probes.step_bench import span_table

    fb = analyze(_trace(tmp_path))
    fb.details["self_time"][0]["code"] = ["pkg/engine.py:5-8"]
    table = span_table(fb.details)
    assert table.startswith("top spans by own time: 'read' 50% (1 ms in 10 calls), 'mlp' 22%")
    assert "'load'" not in table  # no own time
    assert table.endswith("in no child span: 'step' 10% (20% of its time; children 'mlp', 'attention') at "
                          "pkg/engine.py:5-8")
    assert span_table({}).endswith("no span with children holds 8% of busy time")


def _gapped_trace(tmp_path: Path) -> Path:
    """Twelve steps of 90 µs, each followed by 10 µs in no span at all (a sleep before `with span('step')`),
    and one long gap elsewhere that holds less time than the twelve together."""
    events = []
    for i in range(12):
        t = i * 100
        events += [{"ph": "X", "name": "step", "ts": t, "dur": 90, "pid": 1, "tid": 1, "cat": "span"},
                   {"ph": "X", "name": "mlp", "ts": t + 5, "dur": 80, "pid": 1, "tid": 1, "cat": "span"}]
    events += [{"ph": "X", "name": "load", "ts": 1250, "dur": 50, "pid": 1, "tid": 1, "cat": "span"}]
    path = tmp_path / "gapped.json"
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def test_time_in_no_span_at_all_is_found_between_its_neighbours(tmp_path: Path) -> None:
    fb = analyze(_gapped_trace(tmp_path))
    track = fb.details["idle"][0]
    top = track["between"][0]
    assert (top["before"], top["after"], top["gaps"], top["median_ns"]) == ("step", "step", 11, 10_000), track
    assert track["between"][1]["before"] == "step" and track["between"][1]["after"] == "load"
    assert "between 'step' and the next 'step' (11 gaps, median 0.01 ms)" in fb.finding, fb.finding
    gap = [h for h in from_analysis(fb, {}) if "in no span at all" in h.claim]
    assert len(gap) == 1 and gap[0].spans == ["step", NO_SPAN] and gap[0].probe == "roofline", gap
    assert "between 'step' and the next 'step'" in gap[0].claim


def test_a_change_in_no_span_is_located_there_and_noise_names_no_span(tmp_path: Path) -> None:
    before = own_time(load_columns(_gapped_trace(tmp_path)))
    assert before[NO_SPAN] == 11 * 10_000 + 60_000 and before["mlp"] == 12 * 80_000
    after = {**before, NO_SPAN: 60_000, "mlp": before["mlp"] - 30_000}  # the gaps gone; mlp a little noisy
    fb = shift_feedback(before, after)
    assert fb.locality["span"] == NO_SPAN and "the change is in no span" in fb.finding, fb.finding
    noisy = shift_feedback(before, {**before, "mlp": before["mlp"] - 30_000, "step": before["step"] + 25_000})
    assert noisy.locality["span"] == "" and "no one span holds the change" in noisy.finding, noisy.finding
    real = shift_feedback(before, {**before, "mlp": before["mlp"] - 400_000, "step": before["step"] + 20_000})
    assert real.locality["span"] == "mlp"
