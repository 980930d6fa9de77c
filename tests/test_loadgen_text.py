"""loadgen against a server that takes text prompts only and streams no usage (llama-cpp-python's conventions,
tests/text_only_server.py, over our real server): text prompts of the asked length, output tokens counted from
the text, and a probe whose requests all fail says why instead of answering NaN."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from infragent.agent.targets.serving_gates import aa_calibration
from infragent.lab.spec import Scenario
from infragent.probes.loadgen import LoadConfig, run_loadgen
from server_fixture import thread_server
from text_only_server import text_only_front


def _records(fb) -> list[dict]:  # noqa: ANN001
    return json.loads(Path(fb.evidence[0].path).read_text())["runs"][0]["records"]


@pytest.mark.parametrize("ids_status", [500, 422])  # llama-cpp-python 0.3.36's answer; FastAPI's own
def test_a_text_only_server_gets_text_prompts_of_the_asked_length_and_its_output_is_counted(tmp_path, monkeypatch,
                                                                                            ids_status):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    with thread_server() as upstream, text_only_front(upstream, ids_status=ids_status) as url:
        fb = run_loadgen(LoadConfig(base_url=url, num_prompts=6, max_concurrency=3, random_input_len=40,
                                    random_output_len=5, warmup=1, progress=False))
        forced = run_loadgen(LoadConfig(base_url=url, num_prompts=4, max_concurrency=2, random_input_len=40,
                                        random_output_len=5, warmup=0, progress=False, prompt_format="tokens"))
    assert fb.verdict == "pass", fb.finding
    assert fb.locality["prompts"].startswith("text: the server " + ("refused a token-id prompt (HTTP 422"
                                                                    if ids_status == 422 else "answered a token-id "
                                                                    "prompt with HTTP 500"))
    measured = [r for r in _records(fb) if not r["warmup"]]
    assert all(r["success"] and r["output_counted"] == "text" and r["output_tokens"] >= 1 for r in measured)
    assert all(r["finish_reason"] in ("length", "stop") for r in measured)  # how each stream said it ended
    assert all(39 <= r["prompt_len"] <= 41 for r in measured)  # within 2% (at least one token) of 40
    assert fb.numbers["output_throughput"].value > 0
    assert forced.verdict == "fail"
    assert forced.finding.startswith(f"every request failed (4): HTTP {ids_status}")
    assert "valid string" in forced.finding


def test_the_aa_calibration_against_a_server_that_fails_every_request_says_why(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    scenario = Scenario(name="s", num_prompts=4, max_concurrency=2, random_input_len=16, random_output_len=4)
    with thread_server() as upstream, text_only_front(upstream, refuse=503) as url:
        fb = aa_calibration(scenario, url, url, seed=1, blocks=2)
    assert fb.verdict == "fail"
    assert fb.finding.startswith("A/A: every request failed") and "HTTP 503" in fb.finding
    assert "aa_floor" not in fb.numbers
