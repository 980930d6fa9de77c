"""loadgen: vLLM bench-serve metric definitions, arrivals, datasets, and token counts that match the server."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from infragent.analysis.serving_metrics import RequestRecord, bucket_of, by_bucket, serving_metrics
from infragent.probes.load_arrivals import arrival_times
from infragent.probes.load_datasets import DatasetError, file_requests, random_requests, sharegpt_requests
from infragent.probes.loadgen import LoadConfig, run_loadgen
from server_fixture import metric, thread_server


def _record(i, ttft, latency, out, itl, prompt=10, success=True):
    return RequestRecord(i, prompt, out, success=success, ttft_s=ttft, latency_s=latency, itl_s=itl,
                         prompt_tokens=prompt, output_tokens=out)


def test_metrics_follow_vllm_definitions():
    records = [_record(0, 0.100, 0.400, 4, [0.1, 0.1, 0.1]),
               _record(1, 0.200, 0.200, 1, []),
               _record(2, 0.050, 0.650, 3, [0.2, 0.4], prompt=1000),
               _record(3, 0, 0, 0, [], success=False),
               RequestRecord(-1, 5, 5, success=True, ttft_s=9, latency_s=9, prompt_tokens=5, output_tokens=5,
                             warmup=True)]
    m = serving_metrics(records, duration_s=2.0, slos_ms={"ttft": 150, "tpot": 250})
    assert (m.completed, m.failed, m.total_input, m.total_output) == (3, 1, 1020, 8)
    assert m.request_throughput == 1.5 and m.output_throughput == 4.0 and m.total_token_throughput == 514.0
    assert m.tpot_ms.n == 2 and m.tpot_ms.mean == pytest.approx((100 + 300) / 2)  # (E2EL-TTFT)/(out-1)
    assert m.itl_ms.n == 5 and m.itl_ms.median == pytest.approx(100)  # pooled gaps
    assert m.ttft_ms.median == pytest.approx(100) and m.e2el_ms.p99 == pytest.approx(
        np.percentile([400, 200, 650], 99))
    # goodput: #0 (ttft 100, tpot 100) and #1 (ttft 200 > 150: no); #2 ttft 50, tpot 300 > 250: no
    assert m.goodput == pytest.approx(1 / 2.0)
    assert m.prefill_tok_s.median == pytest.approx(100.0)  # 10/0.1, 10/0.2=50, 1000/0.05=20000 -> median 100
    buckets = by_bucket(records, 2.0)
    assert set(buckets) == {"<=128", "<=2048"} and buckets["<=2048"].completed == 1
    assert bucket_of(129) == "<=512" and bucket_of(10**6) == ">8192"
    assert set(m.phases()) == {"prefill", "decode"}


def test_arrival_processes():
    assert arrival_times(4, math.inf) == [0.0] * 4
    assert arrival_times(3, 10.0, process="constant") == pytest.approx([0.0, 0.1, 0.2])
    poisson = np.diff(arrival_times(20000, 50.0, 1.0, "gamma", seed=1))
    assert poisson.mean() == pytest.approx(1 / 50, rel=0.05)
    assert poisson.std() / poisson.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps: CV 1
    bursty = np.diff(arrival_times(20000, 50.0, 0.25, "gamma", seed=1))
    assert bursty.mean() == pytest.approx(1 / 50, rel=0.08) and bursty.std() / bursty.mean() > 1.8
    with pytest.raises(ValueError, match="burstiness"):
        arrival_times(3, 5.0, burstiness=0)


def test_random_prompts_never_share_a_prefix_and_have_exact_lengths():
    requests = random_requests(3000, 64, 16, 49152, seed=3)
    assert len({tuple(r.prompt[:2]) for r in requests}) == 3000
    assert all(len(r.prompt) == r.prompt_len == 64 and r.output_len == 16 for r in requests)
    assert all(1000 <= t < 49152 for r in requests[:50] for t in r.prompt)
    uniform = random_requests(500, 100, 10, 49152, "uniform", 0.5, seed=1)
    assert min(r.prompt_len for r in uniform) >= 50 and max(r.prompt_len for r in uniform) <= 150
    lognormal = random_requests(2000, 100, 10, 49152, "lognormal", sigma=0.5, seed=1)
    assert np.median([r.prompt_len for r in lognormal]) == pytest.approx(100, rel=0.1)


def test_prompt_files_and_sharegpt(tmp_path):
    words = lambda text: len(text.split())  # noqa: E731
    plain = tmp_path / "prompts.txt"
    plain.write_text("one two three\n\n{\"prompt\": \"a b\", \"output_len\": 7}\n")
    rows = file_requests(plain, 32, words)
    assert [(r.prompt, r.prompt_len, r.output_len) for r in rows] == [("one two three", 3, 32), ("a b", 2, 7)]
    plain.write_text("ok\n{\"text\": 1}\n")
    with pytest.raises(DatasetError, match="prompts.txt:2"):
        file_requests(plain, 32, words)
    share = tmp_path / "sharegpt.json"
    share.write_text(json.dumps([{"conversations": [{"from": "human", "value": "w " * 10},
                                                    {"from": "gpt", "value": "r " * 20}]},
                                 {"conversations": [{"from": "human", "value": "hi"}]}]))
    rows = sharegpt_requests(share, words)
    assert [(r.prompt_len, r.output_len) for r in rows] == [(10, 20)]
    with pytest.raises(DatasetError, match="sharegpt.json"):
        sharegpt_requests(tmp_path / "sharegpt.json.missing", words)


def test_token_counts_equal_the_servers_metrics(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    with thread_server() as url:
        before = (metric(url, "infragent:prompt_tokens_total", 'outcome="delivered"'),
                  metric(url, "infragent:generation_tokens_total", 'outcome="delivered"'))
        config = LoadConfig(base_url=url, num_prompts=40, max_concurrency=8, request_rate=200.0,
                            random_input_len=40, random_output_len=8, length_dist="uniform", random_range_ratio=0.5,
                            warmup=2, repeats=2, progress=False)
        fb = run_loadgen(config)
        after = (metric(url, "infragent:prompt_tokens_total", 'outcome="delivered"'),
                 metric(url, "infragent:generation_tokens_total", 'outcome="delivered"'))
    assert fb.verdict == "pass", fb.finding
    runs = json.loads(Path(fb.evidence[0].path).read_text())["runs"]
    records = [rec for run in runs for rec in run["records"]]
    assert len(records) == 2 * (40 + 2) + 1 and all(rec["success"] for rec in records)  # + the prompt-format probe
    assert after[0] - before[0] == sum(rec["prompt_tokens"] for rec in records)
    assert after[1] - before[1] == sum(rec["output_tokens"] for rec in records)
    assert all(rec["output_tokens"] == rec["output_len"] for rec in records)  # ignore_eos: exact lengths
    assert all(rec["prompt_tokens"] == rec["prompt_len"] for rec in records)  # token prompts: exact lengths
    ratio = fb.numbers["output_throughput"]
    assert ratio.n == 2 and ratio.ci_low is not None
    assert set(runs[0]["phases"]) == {"prefill", "decode"} and runs[0]["buckets"]


def test_cli_errors_are_one_line():
    src = Path(__file__).resolve().parent.parent / "src"
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    bad = subprocess.run([sys.executable, "-m", "infragent.cli", "loadgen", "--base-url", "http://127.0.0.1:9",
                          "--goodput", "latency:5"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and bad.stderr.strip() == "error: --goodput 'latency:5': use ttft:MS, tpot:MS or e2el:MS"
    down = subprocess.run([sys.executable, "-m", "infragent.cli", "loadgen", "--base-url", "http://127.0.0.1:9"],
                          capture_output=True, text=True, env=env)
    assert down.returncode == 2 and "cannot list models" in down.stderr and "Traceback" not in down.stderr


def test_chat_endpoint_gets_text_prompts(tmp_path, monkeypatch):
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    with thread_server() as url:
        fb = run_loadgen(LoadConfig(base_url=url, endpoint="/v1/chat/completions", num_prompts=6, max_concurrency=3,
                                    random_input_len=24, random_output_len=4, warmup=0, progress=False))
    assert fb.verdict == "pass", fb.finding
    records = json.loads(Path(fb.evidence[0].path).read_text())["runs"][0]["records"]
    assert all(r["success"] and r["output_tokens"] == 4 for r in records)
    assert all(r["prompt_tokens"] > 24 for r in records)  # the chat template wraps the decoded prompt


def test_interleaved_runs_send_twin_requests_back_to_back():
    """A/B interleaving: each block goes to both sides before the next, in a random order per block."""
    import asyncio

    from infragent.probes.load_pairs import run_interleaved
    from infragent.probes.mock_endpoint import serve_mock

    async def main():
        log: list[tuple[str, int]] = []
        servers = {name: await serve_mock(log=log, name=name) for name in ("A", "B")}
        configs = {name: LoadConfig(base_url=f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}", num_prompts=12,
                                    max_concurrency=1, random_input_len=50, random_output_len=3, length_dist="uniform",
                                    random_range_ratio=0.5, warmup=1, progress=False)
                   for name, s in servers.items()}
        runs = await run_interleaved(configs, {"A": "mock", "B": "mock"}, seed=7)
        for s in servers.values():
            s.close()
        return log, runs

    log, runs = asyncio.run(main())
    measured = log[2:]  # after one warm-up request per side
    assert len(measured) == 24
    blocks = [measured[k:k + 2] for k in range(0, 24, 2)]
    assert all({side for side, _ in b} == {"A", "B"} and b[0][1] == b[1][1] for b in blocks)  # twins, adjacent
    assert {b[0][0] for b in blocks} == {"A", "B"}  # the order is shuffled, not fixed
    a, b = runs["A"], runs["B"]
    assert [(r.index, r.prompt_len) for r in a.records] == [(r.index, r.prompt_len) for r in b.records]
    assert a.metrics.completed == b.metrics.completed == 12
    assert a.metrics.total_output == b.metrics.total_output == sum(r.output_len for r in a.records if not r.warmup)
    starts = [r.start_s for r in a.records if not r.warmup]
    assert starts == sorted(starts) and a.duration_s >= starts[-1]  # blocks laid end to end on each side


def test_itl_counts_token_chunks_only(tmp_path, monkeypatch):
    """At 4 output tokens and concurrency 1: three gaps per request, and ITL's mean is TPOT's."""
    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    with thread_server() as url:
        fb = run_loadgen(LoadConfig(base_url=url, num_prompts=6, max_concurrency=1, random_input_len=16,
                                    random_output_len=4, warmup=1, progress=False))
    records = [r for r in json.loads(Path(fb.evidence[0].path).read_text())["runs"][0]["records"] if not r["warmup"]]
    assert all(len(r["itl_s"]) <= r["output_tokens"] - 1 == 3 for r in records)  # the finish is no gap
    # a token whose text is held back (part of a UTF-8 character) rides the next chunk: one gap fewer
    records = [r for r in records if len(r["itl_s"]) == 3]
    assert len(records) >= 3
    itl = sum(sum(r["itl_s"]) for r in records) / sum(len(r["itl_s"]) for r in records)
    tpot = sum((r["latency_s"] - r["ttft_s"]) / (r["output_tokens"] - 1) for r in records) / len(records)
    assert abs(itl / tpot - 1) < 0.02


def test_fresh_prompts_by_default_and_a_reused_seed_is_flagged(tmp_path, monkeypatch):
    """Default runs draw fresh prompts (the server's prefix cache serves nothing); a second run with the same
    explicit seed is served from the cache the first one warmed, and says so."""
    from infragent.engine.config import EngineConfig

    monkeypatch.setenv("INFRAGENT_ARTIFACTS", str(tmp_path))
    with thread_server(config=EngineConfig(model="llama", max_model_len=256, num_threads=1)) as url:
        def run(seed):
            return run_loadgen(LoadConfig(base_url=url, num_prompts=6, max_concurrency=2, random_input_len=64,
                                          random_output_len=2, warmup=0, progress=False, seed=seed))
        fresh = [run(None), run(None)]
        pinned = [run(5), run(5)]
    for fb in fresh + pinned[:1]:
        cache = json.loads(Path(fb.evidence[0].path).read_text())["runs"][0]["prefix_cache"]
        assert fb.verdict == "pass" and cache["hit_rate"] < 0.05 and not cache["flagged"], (fb.finding, cache)
    assert fresh[0].locality["seed"] != fresh[1].locality["seed"]
    cache = json.loads(Path(pinned[1].evidence[0].path).read_text())["runs"][0]["prefix_cache"]
    assert cache["flagged"] and cache["hit_rate"] > 0.5
    assert pinned[1].verdict == "inconclusive" and "served from the prefix cache" in pinned[1].finding
