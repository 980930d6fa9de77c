"""The OpenAI-compatible server: the official client (sync, async, streaming), errors, backpressure,
disconnects, metrics, and graceful shutdown. Real servers on loopback, a small random-init hybrid model."""
from __future__ import annotations

import asyncio
import gc
import json
import threading
import time
import weakref

import httpx
import openai
import pytest

from server_fixture import (free_port, metric, process_server, sigterm_mid_stream, thread_server, tiny_config,
                            wait_healthy)


@pytest.fixture(scope="module")
def server():
    with thread_server() as url:
        yield url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def test_official_client_sync_both_endpoints(server):
    client = _client(server)
    done = client.completions.create(model="hybrid", prompt="The capital of France is", max_tokens=5, seed=1)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 5
    assert done.usage.total_tokens == done.usage.prompt_tokens + 5 and done.choices[0].text
    chat = client.chat.completions.create(model="hybrid", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=4, temperature=0.7, top_p=0.9, extra_body={"top_k": 20})
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].finish_reason == "length"
    assert chat.usage.completion_tokens == 4
    models = client.models.list()
    assert [m.id for m in models.data] == ["hybrid"]


def test_seeded_sampling_is_reproducible(server):
    client = _client(server)
    texts = {client.completions.create(model="hybrid", prompt="Once", max_tokens=6, temperature=1.0, seed=7)
             .choices[0].text for _ in range(2)}
    assert len(texts) == 1


def test_official_client_async_both_endpoints(server):
    async def run() -> None:
        client = openai.AsyncOpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
        done, chat = await asyncio.gather(
            client.completions.create(model="hybrid", prompt="Hello", max_tokens=3),
            client.chat.completions.create(model="hybrid", messages=[{"role": "user", "content": "Hi"}], max_tokens=3))
        assert done.usage.completion_tokens == 3 and chat.usage.completion_tokens == 3
        await client.close()
    asyncio.run(run())


def test_official_client_streaming_both_endpoints(server):
    client = _client(server)
    chunks = list(client.completions.create(model="hybrid", prompt="Hello", max_tokens=6, stream=True,
                                            stream_options={"include_usage": True}))
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == 6 and chunks[-1].choices == []
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    chat_chunks = list(client.chat.completions.create(
        model="hybrid", messages=[{"role": "user", "content": "Hi"}], max_tokens=5, stream=True))
    assert chat_chunks[0].choices[0].delta.role == "assistant"
    assert chat_chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chat_chunks)  # no include_usage: no usage chunk
    assert text  # some text arrived


def test_stream_text_equals_non_stream_text(server):
    client = _client(server)
    whole = client.completions.create(model="hybrid", prompt="abc", max_tokens=8, temperature=0.0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="hybrid", prompt="abc", max_tokens=8, temperature=0.0, stream=True) if c.choices)
    assert streamed == whole.choices[0].text


def test_stop_strings_are_never_streamed(server):
    client = _client(server)
    whole = client.completions.create(model="hybrid", prompt="x", max_tokens=12, temperature=0.0)
    text = whole.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 3]
    assume_text = text[:text.find(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="hybrid", prompt="x", max_tokens=12, temperature=0.0, stop=[stop], stream=True) if c.choices)
    assert streamed == assume_text and stop not in streamed


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "top_p": 1.5}, "top_p"),
    ({"prompt": "hi", "temperature": -1}, "temperature"),
    ({"prompt": "word " * 600}, "prompt"),
    ({"prompt": "hi", "n": 9}, "n"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"max_tokens": 3}, "prompt"),
])
def test_bad_requests_get_openai_shaped_400s(server, body, param):
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=10)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_malformed_json_and_unknown_routes(server):
    response = httpx.post(f"{server}/v1/completions", content=b'{"prompt": ', timeout=10,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    assert httpx.get(f"{server}/v1/nothing", timeout=10).status_code == 404
    chat = httpx.post(f"{server}/v1/chat/completions", json={"messages": []}, timeout=10)
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "messages"
    with pytest.raises(openai.BadRequestError):
        _client(server).completions.create(model="hybrid", prompt="hi", max_tokens=-5)
    assert _client(server).completions.create(model="hybrid", prompt="still serving", max_tokens=2).usage


def test_api_key_is_required_when_set():
    with thread_server(api_key="sekret") as url:
        bad = httpx.post(f"{url}/v1/completions", json={"prompt": "hi"}, timeout=10)
        assert bad.status_code == 401 and bad.json()["error"]["code"] == "invalid_api_key"
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        good = openai.OpenAI(base_url=f"{url}/v1", api_key="sekret", max_retries=0)
        assert good.completions.create(model="hybrid", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # health and metrics stay open


def test_a_stopped_server_leaves_nothing_holding_its_engine():
    """FastAPI remembers facts about each endpoint function for the life of the process: routes that closed
    over the engine kept every server's model and KV cache alive after it stopped."""
    from infragent.engine.server.serve import make_server

    port = free_port()
    server = make_server(tiny_config(), port=port, shutdown_timeout_s=5)
    engine = weakref.ref(server.config.app.state.served.engine)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url)
    done = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2}, timeout=30)
    assert done.status_code == 200 and httpx.get(f"{url}/v1/models", timeout=5).status_code == 200
    server.should_exit = True
    thread.join(30)
    del server
    gc.collect()
    assert engine() is None


def test_full_queue_answers_429_with_retry_after():
    with thread_server(max_waiting=2, max_num_seqs=1) as url:
        async def burst() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                return await asyncio.gather(*[client.post(f"{url}/v1/completions", json={
                    "prompt": "hi", "max_tokens": 30, "ignore_eos": True}) for _ in range(10)])
        responses = asyncio.run(burst())
        codes = sorted(r.status_code for r in responses)
        assert 429 in codes and 200 in codes and set(codes) <= {200, 429}
        refused = next(r for r in responses if r.status_code == 429)
        assert refused.headers["retry-after"] == "1" and refused.json()["error"]["type"] == "rate_limit_error"
        assert metric(url, "infragent:requests_total", 'status="rejected"') == codes.count(429)


def _wait_idle(url: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (metric(url, "infragent:num_requests_running") == 0 and metric(url, "infragent:num_requests_waiting") == 0
                and metric(url, "infragent:kv_blocks_used") == 0 and metric(url, "infragent:state_slots_used") == 0):
            return
        time.sleep(0.05)
    raise AssertionError("server still holds requests, KV blocks or state slots")


def test_disconnects_abort_and_free_blocks_and_slots():
    with thread_server() as url:
        body = {"prompt": "tell me a long story", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # first chunk arrived: the request is running; hang up
        assert metric(url, "infragent:kv_blocks_used") > 0 or metric(url, "infragent:requests_total", 'status="abort"')
        with pytest.raises(httpx.ReadTimeout):  # non-streaming: the client gives up waiting
            httpx.post(f"{url}/v1/completions", json={**body, "stream": False}, timeout=0.3)
        _wait_idle(url)
        assert metric(url, "infragent:requests_total", 'status="abort"') == 2
        assert metric(url, "infragent:generation_tokens_total", 'outcome="aborted"') > 0


def test_metrics_cover_requests_tokens_queues_cache_and_latency(server):
    client = _client(server)
    client.completions.create(model="hybrid", prompt="Hello", max_tokens=3)
    text = httpx.get(f"{server}/metrics", timeout=5).text
    for name in ("infragent:requests_total", "infragent:prompt_tokens_total", "infragent:generation_tokens_total",
                 "infragent:num_requests_running", "infragent:num_requests_waiting", "infragent:kv_blocks_used",
                 "infragent:kv_blocks_total", "infragent:state_slots_used", "infragent:state_slots_total",
                 "infragent:time_to_first_token_seconds_bucket", "infragent:inter_token_latency_seconds_bucket"):
        assert name in text, name
    assert metric(server, "infragent:time_to_first_token_seconds_count") >= 1


def test_sigterm_finishes_in_flight_requests_and_exits_zero():
    with process_server("--shutdown-timeout", "20") as (url, proc):
        lines = sigterm_mid_stream(url, proc)
        assert proc.wait(30) == 0
        data = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        assert lines[-1 if lines[-1] else -2] == "data: [DONE]"
        assert data[-1]["choices"][0]["finish_reason"] == "length"
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health", timeout=2)


def test_profile_endpoints_write_a_kineto_trace_of_the_steps(tmp_path):
    import gzip

    with thread_server(max_num_seqs=4) as url:
        off = httpx.post(f"{url}/start_profile", timeout=30)
        assert off.status_code == 400 and "--profile-dir" in off.json()["error"]["message"]
    with thread_server(max_num_seqs=4, profile_dir=str(tmp_path)) as url:
        assert httpx.post(f"{url}/stop_profile", timeout=30).status_code == 409  # not profiling yet
        assert httpx.post(f"{url}/start_profile", timeout=30).json()["status"] == "profiling"
        again = httpx.post(f"{url}/start_profile", timeout=30)
        assert again.status_code == 409 and "already profiling" in again.json()["error"]["message"]
        done = httpx.post(f"{url}/v1/completions", json={"prompt": "hello there", "max_tokens": 6}, timeout=60)
        assert done.status_code == 200
        traces = httpx.post(f"{url}/stop_profile", timeout=120).json()["traces"]
        assert len(traces) == 1 and traces[0].startswith(str(tmp_path)) and traces[0].endswith(".json.gz")
        events = json.loads(gzip.open(traces[0]).read())["traceEvents"]
        names = {e.get("name", "") for e in events}
        assert any(n.startswith("ProfilerStep#") for n in names) and "aten::mm" in names
        after = httpx.post(f"{url}/v1/completions", json={"prompt": "still serving", "max_tokens": 2}, timeout=60)
        assert after.status_code == 200
