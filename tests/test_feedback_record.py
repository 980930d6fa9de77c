"""Feedback as data (JSON, text) and the record probe's trace evidence."""
import hashlib
import json
from pathlib import Path

import pytest

from infragent.probes.feedback import Feedback, Measure
from infragent.probes.record import run_record
from infragent.trace import span
from infragent.trace_model import Trace


def test_feedback_renders_as_json_and_text():
    fb = Feedback("bench", "fail", "B is slower than A by 5.1%",
                  numbers={"ratio": Measure(1.051, "×", 1.04, 1.06, 40), "p": Measure(float("nan"))},
                  locality={"kernel": "decode_attention"}, next_probes=["roofline"])
    data = json.loads(fb.to_json())
    assert data["numbers"]["ratio"]["ci_low"] == 1.04 and data["numbers"]["p"]["value"] is None
    text = fb.render()
    assert text.splitlines()[0] == "[bench] FAIL: B is slower than A by 5.1%"
    assert "1.051 [1.04, 1.06] ×" in text and "kernel=decode_attention" in text


def test_feedback_rejects_unknown_verdicts():
    with pytest.raises(ValueError, match="verdict"):
        Feedback("bench", "slower", "x")


def _workload() -> None:
    for step in range(3):
        with span("step", step=step):
            with span("decode"):
                sum(range(20000))


def test_record_writes_a_trace_and_points_at_it(tmp_path):
    fb = run_record(_workload, tmp_path / "trace.json")
    assert fb.verdict == "pass" and "step" in fb.finding
    evidence = fb.evidence[0]
    assert hashlib.sha256(Path(evidence.path).read_bytes()).hexdigest() == evidence.sha256
    trace = Trace.load(evidence.path)
    assert len(trace.named("step")) == 3 and len(trace.named("decode")) == 3
    totals = {row["name"]: row for row in fb.details["span_totals"]}
    assert totals["decode"]["count"] == 3


def test_record_says_when_nothing_was_instrumented(tmp_path):
    fb = run_record(lambda: None, tmp_path / "empty.json")
    assert fb.verdict == "inconclusive" and "no spans" in fb.finding
