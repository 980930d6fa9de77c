"""The OpenAI surface clients rely on, on the real model (SmolLM2-135M): logprobs (checked against the
engine's own log-softmax), echo for loglikelihood scoring, penalties, stop_token_ids, min_tokens, unknown
models, max_tokens past the context, strict types, refused features, text no tokenizer takes, the body
size limit, and the prefix-cache counters loadgen reads."""
from __future__ import annotations

import httpx
import openai
import pytest
import torch

from infragent.engine.config import EngineConfig
from infragent.engine.llm import LLM
from infragent.engine.sampling import SamplingParams
from server_fixture import metric, thread_server

CONTEXT = 256
LIMIT = 2 * 1024 * 1024  # above the 1 MB prompts of the stall test
PROMPT = "The capital of France is"


def _config() -> EngineConfig:
    return EngineConfig(model="llama", max_model_len=CONTEXT, num_threads=1)


@pytest.fixture(scope="module")
def server():
    with thread_server(config=_config(), max_request_bytes=LIMIT) as url:
        yield url


@pytest.fixture(scope="module")
def reference() -> LLM:
    """The same model offline: whole log-softmax rows at every prompt position."""
    return LLM(model="llama", max_model_len=CONTEXT, num_threads=1)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def _rows(reference: LLM, token_ids: list[int]) -> torch.Tensor:
    out = reference.generate([token_ids], SamplingParams(max_tokens=1, prompt_logprobs=True))[0]
    return out.prompt_logprobs


def test_completion_logprobs_match_the_engines_log_softmax(client, reference):
    response = client.completions.create(model="llama", prompt=PROMPT, max_tokens=4, temperature=0.0, logprobs=3)
    choice = response.choices[0]
    prompt_ids = reference.engine.tokenizer.encode(PROMPT)
    offline = reference.generate([prompt_ids], SamplingParams(max_tokens=4, temperature=0.0, logprobs=3))[0]
    rows = _rows(reference, prompt_ids + offline.token_ids)  # the whole sequence prefilled at once
    for i, (token, value) in enumerate(zip(offline.token_ids, choice.logprobs.token_logprobs)):
        assert abs(value - offline.logprobs[i].logprob) < 1e-5  # the engine's decode steps, as the server ran them
        # the same log-softmax from a prefill of the whole sequence: the first token is that very row; later
        # ones come from decode steps, whose kernels round differently from a prefill's (about 1e-5)
        expected = float(rows[len(prompt_ids) - 1 + i, token])
        assert abs(value - expected) < (1e-5 if i == 0 else 1e-4), (i, value, expected)
    top = choice.logprobs.top_logprobs[0]
    best = rows[len(prompt_ids) - 1].topk(3)
    assert len(top) == 3 and abs(max(top.values()) - float(best.values[0])) < 1e-5
    assert "".join(choice.logprobs.tokens) == choice.text


def test_echo_with_max_tokens_0_scores_the_prompt(client, reference):
    response = client.completions.create(model="llama", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = response.choices[0]
    ids = reference.engine.tokenizer.encode(PROMPT)
    rows = _rows(reference, ids)
    assert choice.text == PROMPT and response.usage.completion_tokens == 0
    assert choice.logprobs.token_logprobs[0] is None and len(choice.logprobs.token_logprobs) == len(ids)
    for j in range(1, len(ids)):
        assert abs(choice.logprobs.token_logprobs[j] - float(rows[j - 1, ids[j]])) < 1e-5
    assert choice.logprobs.text_offset == [PROMPT.find(t, o) for t, o in zip(choice.logprobs.tokens,
                                                                             choice.logprobs.text_offset)]


def test_chat_logprobs_whole_and_streamed_parse_in_the_official_client(client):
    kwargs = dict(model="llama", messages=[{"role": "user", "content": "Say hi"}], max_tokens=4, temperature=0.0,
                  logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kwargs)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 and bytes(c.bytes).decode(errors="replace") == c.token
               for c in content)
    streamed = [c for chunk in client.chat.completions.create(**kwargs, stream=True) if chunk.choices
                and chunk.choices[0].logprobs for c in chunk.choices[0].logprobs.content]
    # The second request may reuse the first's cached prompt blocks, a different order of float sums: the same
    # tokens, and logprobs equal to well within what greedy decoding could notice (rounding can straddle a digit).
    assert [c.token for c in streamed] == [c.token for c in content]
    assert [c.logprob for c in streamed] == pytest.approx([c.logprob for c in content], abs=1e-4)


def test_penalties_stop_token_ids_and_min_tokens(server, reference):
    def complete(**extra):
        body = {"prompt": "one one one one one one", "max_tokens": 12, "temperature": 0.0, **extra}
        response = httpx.post(f"{server}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()
    plain, penalized = complete(), complete(frequency_penalty=2.0, presence_penalty=2.0)
    assert plain["choices"][0]["text"] != penalized["choices"][0]["text"]
    first = reference.engine.tokenizer.encode(plain["choices"][0]["text"])[0]
    stopped = complete(stop_token_ids=[first])
    assert stopped["choices"][0]["finish_reason"] == "stop" and stopped["usage"]["completion_tokens"] == 1
    eos = reference.engine.tokenizer.eos_token_id
    floor = complete(min_tokens=12, stop_token_ids=[first, eos])
    assert floor["usage"]["completion_tokens"] == 12


@pytest.mark.parametrize("body, status, param", [
    ({"prompt": "hi", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "hi", "max_tokens": CONTEXT}, 400, "max_tokens"),
    ({"prompt": "hi", "temperature": "0.5"}, 400, "temperature"),
    ({"prompt": "hi", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}}, 400, "response_format"),
    ({"prompt": "hi", "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ({"prompt": "hi", "logit_bias": {"50": 100}}, 400, "logit_bias"),
    ({"prompt": "hi", "min_tokens": 5, "max_tokens": 2}, 400, "min_tokens"),
    ({"prompt": "x " * 20000}, 400, "prompt"),
])
def test_what_is_not_served_is_refused_not_ignored(server, body, status, param):
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
    assert response.status_code == status, response.text
    assert response.json()["error"]["param"] == param


def test_chat_defaults_to_the_rest_of_the_context(server):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": None, "ignore_eos": True,
            "temperature": 0.0}
    response = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=120)
    used = response.json()["usage"]
    assert response.status_code == 200 and used["prompt_tokens"] + used["completion_tokens"] == CONTEXT


def test_bad_text_and_large_bodies_keep_the_connection_usable(server):
    good = {"prompt": "hi", "max_tokens": 1}
    with httpx.Client(base_url=server, timeout=30) as http:
        for raw in (b'{"prompt": "hi \\ud800", "max_tokens": 1}',
                    b'{"messages": [{"role": "user", "content": "\\udc00"}]}',
                    b'{"prompt": "hi", "pad": "' + b"x" * (2 * LIMIT) + b'"}'):
            path = "/v1/chat/completions" if b"messages" in raw else "/v1/completions"
            bad = http.post(path, content=raw, headers={"content-type": "application/json"})
            assert bad.status_code in (400, 413) and bad.json()["error"]["message"], bad.text
            assert http.post("/v1/completions", json=good).status_code == 200
    assert metric(server, "infragent:requests_total", 'status="error"') == 0


def test_prefix_cache_counters_count_a_repeated_prompt(server):
    prompt = list(range(1000, 1100))  # 100 tokens: several full blocks
    before = metric(server, "infragent:prefix_cache_hits_total")
    for _ in range(2):
        assert httpx.post(f"{server}/v1/completions", json={"prompt": prompt, "max_tokens": 1},
                          timeout=30).status_code == 200
    assert metric(server, "infragent:prefix_cache_hits_total") - before >= 64


def test_n_choices_share_one_prefill_and_derive_their_seeds(server, client):
    prompt = list(range(3000, 3040))
    before = metric(server, "infragent:prompt_tokens_computed_total")
    body = {"prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 11, "n": 4}
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=60).json()
    assert metric(server, "infragent:prompt_tokens_computed_total") - before == len(prompt)  # prefilled once
    texts = [c["text"] for c in sorted(response["choices"], key=lambda c: c["index"])]
    assert len(texts) == 4 and len(set(texts)) == 4
    assert response["usage"]["completion_tokens"] == 24 and response["usage"]["prompt_tokens"] == len(prompt)
    alone = httpx.post(f"{server}/v1/completions", json={**body, "n": 1, "seed": 13}, timeout=60).json()
    assert alone["choices"][0]["text"] == texts[2]  # choice i samples with seed + i
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(model="llama", prompt=prompt, max_tokens=6, temperature=1.0, seed=11,
                                           n=4, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] = streamed.get(choice.index, "") + choice.text
    assert [streamed[i] for i in range(4)] == texts


def test_a_stream_goes_on_while_another_client_sends_huge_prompts(server):
    """1 MB prompts (refused before tokenizing) and prompts just under the character bound (tokenized in a
    worker thread, then refused) do not freeze a running stream; before, one 1 MB prompt froze it for 1.1 s."""
    import threading
    import time

    huge = {"prompt": "word " * 200_000, "max_tokens": 4}
    long = {"prompt": "word " * (CONTEXT * 81 // 5 - 10), "max_tokens": 4}
    answers: list[tuple[int, float]] = []
    started = threading.Event()

    def flood() -> None:
        started.wait(30)
        with httpx.Client(base_url=server, timeout=30) as http:
            for body in [huge, long] * 4:
                t0 = time.perf_counter()
                answers.append((http.post("/v1/completions", json=body).status_code, time.perf_counter() - t0))

    sender = threading.Thread(target=flood)
    sender.start()
    stamps = []
    body = {"prompt": list(range(4000, 4016)), "max_tokens": 48, "temperature": 0.0, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {") and '"text":""' not in line.replace(" ", ""):
                stamps.append(time.perf_counter())
                started.set()
    sender.join(60)
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert [code for code, _ in answers] == [400] * 8
    assert max(took for _, took in answers) < 1.0
    assert max(gaps) < 0.5, (max(gaps), sorted(gaps)[len(gaps) // 2])


def test_a_chunked_body_past_the_limit_gets_413_and_nulls_are_defaults(server):
    def chunks():
        yield b'{"prompt": "hi", "pad": "'
        for _ in range(3):
            yield b"x" * LIMIT
        yield b'"}'
    response = httpx.post(f"{server}/v1/completions", content=chunks(), timeout=30,
                          headers={"content-type": "application/json"})  # no content-length: counted as it comes
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "logprobs": None, "top_logprobs": None}
    assert httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30).status_code == 200
    assert httpx.post(f"{server}/v1/completions", json={"prompt": "hi", "max_tokens": 2, "echo": None},
                      timeout=30).status_code == 200
