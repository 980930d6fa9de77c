"""The outside diagnosis's parts on known inputs: each stack's /metrics exposition read into one vocabulary, the
rules that turn series, client records, threads and stacks into bottlenecks (and stay silent on blips), the
batch limit read from a launch line, py-spy's output and its refusal, and a pid that is not the server."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from infragent.analysis.serving_metrics import RequestRecord
from infragent.probes.processes import NotTheServer, server_processes
from infragent.probes.server_findings import (kv_capacity, launch_limit, prefill_interference, queueing, serialized,
                                              starved, tokenization)
from infragent.probes.server_metrics import MetricsSeries, Scrape, parse
from infragent.probes.server_stacks import StackSampling, parse_speedscope, pyspy_failure
from infragent.probes.server_threads import ThreadReading

VLLM = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.97
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.5
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 5.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 3.0
vllm:time_to_first_token_seconds_count{model_name="m"} 3.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.2
"""
SGLANG = """# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="qwen"} 8.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="qwen"} 0.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="qwen"} 0.42
"""
LLAMACPP = """# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total 1234
# TYPE llamacpp:kv_cache_usage_ratio gauge
llamacpp:kv_cache_usage_ratio 0.25
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing 1
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred 3
"""


def test_each_family_is_read_into_one_vocabulary() -> None:
    family, values, _ = parse(VLLM)
    assert family == "vllm" and values == {"running": 16.0, "waiting": 3.0, "kv_usage": 0.97, "preemptions": 5.0}
    assert parse(SGLANG)[:2] == ("sglang", {"running": 8.0, "waiting": 0.0, "kv_usage": 0.42})
    assert parse(LLAMACPP)[:2] == ("llamacpp", {"running": 1.0, "waiting": 3.0, "kv_usage": 0.25,
                                                "prompt_tokens": 1234.0})
    assert parse("tgi_queue_size 4\ntgi_batch_current_size 2\n")[:2] == ("tgi", {"running": 2.0, "waiting": 4.0})
    assert parse("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3\n")[0] is None


def test_the_batch_limit_is_read_from_any_stacks_launch_line() -> None:
    assert launch_limit(["vllm", "serve", "m", "--max-num-seqs", "8"]) == ("--max-num-seqs", 8)
    assert launch_limit(["python", "-m", "sglang.launch_server", "--max-running-requests=4"]) == \
        ("--max-running-requests", 4)
    assert launch_limit(["llama-server", "-m", "x.gguf", "-np", "2"]) == ("-np", 2)
    assert launch_limit(["infragent", "serve", "--max-num-seqs"]) is None


def _series(rows: list[dict[str, float]], family: str = "vllm") -> MetricsSeries:
    return MetricsSeries("http://x/metrics", family, [Scrape(i * 0.25, r) for i, r in enumerate(rows)])


def test_a_queue_behind_a_held_batch_is_a_cap_and_a_blip_is_not() -> None:
    capped = _series([{"running": 2, "waiting": 6, "kv_usage": 0.1}] * 20)
    found = queueing(capped, ("--max-num-seqs", 2), offered=8)
    assert found is not None and found.acts_on == ["batch_limit"]
    assert "held at 2 (--max-num-seqs 2 on the launch line)" in found.claim
    unknown = queueing(capped, None, offered=8)  # no flag on the line: the ceiling alone says it
    assert unknown is not None and "held at 2" in unknown.claim and "launch line" not in unknown.claim
    blips = _series([{"running": 7, "waiting": 1, "kv_usage": 0.1}] * 20)  # one request between steps
    assert queueing(blips, None, offered=8) is None
    below = _series([{"running": r, "waiting": 5, "kv_usage": 0.2} for r in (3, 5, 4, 6) * 5])
    held_back = queueing(below, ("--max-num-seqs", 32), offered=16)
    assert held_back is not None and held_back.acts_on == ["prefill_chunk", "kv_capacity"]
    assert "below its limit (--max-num-seqs 32)" in held_back.claim
    unknown_limit = queueing(below, None, offered=16)  # no flag: a batch that keeps moving is not held at a cap
    assert unknown_limit is not None and "below its own peak of 6" in unknown_limit.claim
    waves = _series([{"running": 8, "waiting": 0}, {"running": 8, "waiting": 0}, {"running": 1, "waiting": 7}] * 8)
    assert queueing(waves, ("--max-num-seqs", 16), offered=8) is None  # a whole wave admitted between waves
    churn = _series([{"running": r, "waiting": 6, "kv_usage": 0.1} for r in (2, 2, 1, 2, 1, 2) * 4])
    at_flag = queueing(churn, ("--max-num-seqs", 2), offered=8)  # turnover between steps, at the launch limit
    assert at_flag is not None and at_flag.kind == "queueing at the batch limit"
    full = _series([{"running": 3, "waiting": 5, "kv_usage": 0.98, "preemptions": float(i)} for i in range(20)])
    assert queueing(full, None, offered=8) is None  # the KV rule speaks for that queue
    kv = kv_capacity(full)
    assert kv is not None and kv.acts_on == ["kv_capacity"] and "preempted" in kv.claim


def _record(i: int, start: float, ttft: float, gaps: list[float]) -> RequestRecord:
    return RequestRecord(i, 64, len(gaps) + 1, start_s=start, success=True, ttft_s=ttft,
                         latency_s=ttft + sum(gaps), itl_s=gaps, output_tokens=len(gaps) + 1)


def test_one_request_at_a_time_is_seen_from_the_client_alone() -> None:
    one_by_one = [_record(i, 0.0, 0.05 + i * 0.5, [0.05] * 8) for i in range(6)]  # each starts as the last ends
    assert serialized(one_by_one, offered=6) is not None
    batched = [_record(i, 0.0, 0.05, [0.05] * 8) for i in range(6)]
    assert serialized(batched, offered=6) is None


def test_token_gaps_that_span_another_prefill_are_interference() -> None:
    records = [_record(0, 0.0, 0.01, [0.01] * 60)]  # a stream of 10 ms gaps ...
    records += [_record(i, 0.05 * i, 0.02, [0.01]) for i in range(1, 12)]  # ... and prefills arriving meanwhile
    for r in records[1:]:  # each prefill stretches the long stream's gap that spans it
        r.start_s += 0.001
    spanned = {round(r.start_s, 3) for r in records[1:]}
    t, gaps = 0.01, []
    for _ in range(60):
        gap = 0.04 if any(t < s < t + 0.01 for s in spanned) else 0.01
        gaps.append(gap)
        t += gap
    records[0] = _record(0, 0.0, 0.01, gaps)
    found = prefill_interference(records * 2)
    assert found is not None and found.acts_on == ["prefill_chunk"]
    quiet = [_record(0, 0.0, 0.01, [0.01] * 60)] + [_record(i, 5.0 + i, 0.02, [0.01] * 20) for i in range(1, 12)]
    assert prefill_interference(quiet) is None


def _speedscope() -> dict:
    frames = [{"name": 'process 7:"python -m server --tokenizer-mode slow"', "file": "", "line": 0},
              {"name": "_run", "file": "/app/engine.py", "line": 10},
              {"name": "OpOverloadPacket.__call__", "file": "/venv/lib/python3.11/site-packages/torch/_ops.py",
               "line": 1},
              {"name": "submit", "file": "/app/server.py", "line": 5},
              {"name": "SlowBPE._word", "file": "/app/tokenizer_slow.py", "line": 42}]
    return {"shared": {"frames": frames}, "profiles": [
        {"name": 'Process 7 Thread 8 "engine-loop"', "samples": [[0, 1, 2]] * 60},
        {"name": 'Process 7 Thread 9 "asyncio_0"', "samples": [[0, 3, 4]] * 40}]}


def test_stacks_name_tokenization_and_skip_torch_leaves_and_process_roots() -> None:
    threads = parse_speedscope(_speedscope())
    engine, worker = threads
    assert engine.name == "engine-loop" and engine.tokenizing == 0  # the process frame names the flag: not code
    assert engine.functions.most_common(1)[0][0] == "_run (engine.py:10)"  # torch's dispatch leaf: its caller
    assert worker.tokenizing == 40
    found = tokenization(StackSampling(threads, 97), requests=20)
    assert found is not None and "SlowBPE._word (tokenizer_slow.py:42)" in found.claim and "40%" in found.claim
    assert any("ms of tokenization CPU per request" in e for e in found.evidence)


def test_pyspy_refused_ptrace_says_how_to_grant_it() -> None:
    said = pyspy_failure("Error: Failed to attach\nPermission Denied: Try running again with elevated permissions", 42)
    assert "pid 42" in said and "CAP_SYS_PTRACE" in said and "ptrace_scope" in said


def test_starved_threads_are_the_servers_own_or_the_machines() -> None:
    busy = [ThreadReading(1, 2, "engine-loop", cpu_s=1.0, runqueue_s=1.0)]
    own = starved(busy, cores=2, elapsed_s=2.0, others_cores=0.6)  # 0.5 of it was the server itself
    assert own is not None and own.acts_on == ["threads"]
    crowded = starved(busy, cores=2, elapsed_s=2.0, others_cores=1.8)
    assert crowded is not None and crowded.kind == "contended machine" and not crowded.acts_on


def test_a_pid_or_group_that_does_not_own_the_port_is_refused() -> None:
    listener = subprocess.Popen([sys.executable, "-c", "import socket, time\ns = socket.socket()\n"
                                 "s.bind(('127.0.0.1', 0)); s.listen(); print(s.getsockname()[1], flush=True)\n"
                                 "time.sleep(60)"], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        port = int(listener.stdout.readline())
        url = f"http://127.0.0.1:{port}"
        assert server_processes(url) == [listener.pid]
        with pytest.raises(NotTheServer, match=rf"--pid {os.getpid()}: .* does not serve port {port}; "
                                               rf"pid {listener.pid} .* listens there: pass --pid {listener.pid}"):
            server_processes(url, pid=os.getpid())
        with pytest.raises(NotTheServer, match="no such process"):
            server_processes(url, pid=2 ** 22 + 7)
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            nobody = free.getsockname()[1]
        with pytest.raises(NotTheServer, match="nothing this user can see listens"):
            server_processes(f"http://127.0.0.1:{nobody}", pid=listener.pid)
    finally:
        listener.kill()
        listener.wait()


def test_a_knob_that_acts_on_an_unknown_word_is_one_line_naming_the_words(tmp_path) -> None:
    from infragent.lab.spec import SpecError, load_spec

    spec = tmp_path / "spec.toml"
    spec.write_text('[target]\nkind = "command"\ncommand = "serve --port {port} -np {slots}"\n'
                    'base_url = "http://127.0.0.1:{port}"\nready_url = "http://127.0.0.1:{port}/health"\n\n'
                    '[knobs.slots]\ntype = "int"\ndomain = [1, 8]\n'
                    'acts_on = ["batch_size"]\n\n[[scenarios]]\nname = "s"\n')
    with pytest.raises(SpecError) as err:
        load_spec(spec)
    said = str(err.value)
    assert "knobs.slots.acts_on" in said and "'batch_size'" in said and "batch_limit" in said, said
    assert len(said.splitlines()) == 1


def test_one_thread_always_on_a_core_with_cores_idle_is_a_threads_bottleneck() -> None:
    from infragent.probes.server_findings import one_busy_thread

    alone = [ThreadReading(1, 2, "engine-loop", cpu_s=1.9), ThreadReading(1, 3, "MainThread", cpu_s=0.2)]
    found = one_busy_thread(alone, cores=2, elapsed_s=2.0, others_cores=1.1)  # others: the server's 1.05 + 0.05
    assert found is not None and found.acts_on == ["threads"] and "'engine-loop' was on a core 95%" in found.claim
    assert one_busy_thread(alone, cores=2, elapsed_s=2.0, others_cores=2.0) is None  # a contended machine
    spread = [ThreadReading(1, 2, "a", cpu_s=1.9), ThreadReading(1, 3, "b", cpu_s=1.8)]
    assert one_busy_thread(spread, cores=2, elapsed_s=2.0, others_cores=1.9) is None  # both cores used


def test_requests_turned_away_are_an_admission_bound_and_a_few_are_not() -> None:
    from infragent.probes.server_findings import refused

    served = [_record(i, 0.0, 0.05, [0.05] * 4) for i in range(10)]
    away = [RequestRecord(20 + i, 64, 8, error='HTTP 429: {"error": {"message": "queue full"}}') for i in range(5)]
    found = refused(served + away)
    assert found is not None and "refused 5 of 15" in found.claim and "HTTP 429" in found.evidence[0]
    assert refused(served + away[:0]) is None


def _ended(i: int, got: int, reason: str, asked: int = 64) -> RequestRecord:
    return RequestRecord(i, 256, asked, start_s=0.1 * i, success=True, ttft_s=0.5, latency_s=0.5 + 0.02 * got,
                         itl_s=[0.02] * (got - 1), output_tokens=got, finish_reason=reason)


def test_requests_ended_far_short_of_their_tokens_are_named_by_how_they_ended() -> None:
    from infragent.probes.server_findings import cut_short

    full = [_ended(i, 64, "length") for i in range(6)]
    interrupted = full[:2] + [_ended(10 + i, 1, "") for i in range(8)]  # a new request interrupts the stream
    found = cut_short(interrupted)
    assert found is not None and found.acts_on == ["batch_limit"] and "8 of 10" in found.claim
    assert "median 1 of the 64 tokens" in found.evidence[0] and "8 without a finish_reason" in found.evidence[0]
    at_context = cut_short(full[:2] + [_ended(20 + i, 9, "length") for i in range(5)])
    assert at_context is not None and at_context.acts_on == ["kv_capacity"]
    by_model = cut_short(full[:2] + [_ended(30 + i, 12, "stop") for i in range(5)])
    assert by_model is not None and not by_model.acts_on and "ignore_eos" in by_model.claim
    assert cut_short(full) is None
    assert cut_short(full + [_ended(40, 1, "")]) is None  # one short request among seven is a blip


def test_a_thread_that_barely_ran_is_not_starved_whatever_its_wait() -> None:
    woke = [ThreadReading(1, 1, "MainThread", cpu_s=0.12, runqueue_s=0.06),  # 32% of its runnable time
            ThreadReading(1, 2, "worker", cpu_s=8.6, runqueue_s=0.28)]
    assert starved(woke, cores=2, elapsed_s=15.0, others_cores=1.7) is None
