"""Fuzz: Hypothesis writes request bodies — any Unicode (lone surrogates too), wrong types in every field, bodies
up to and past the size limit; the server never answers 5xx, never hangs, and never resets the connection: one
keep-alive client sends a good request after each bad one."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_fixture import metric, thread_server

ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=40)  # surrogates included
SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | ANY_TEXT)
LIMIT = 8192  # the fuzzed server's body limit
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=12), inner, max_size=4), max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot", ""]) | ANY_JSON,
                                 "content": st.text(max_size=80) | ANY_JSON})
FIELDS = {
    "prompt": ANY_TEXT | st.text(max_size=200) | st.lists(st.integers(-5, 60000), max_size=30) | ANY_JSON,
    "messages": st.lists(MESSAGE, max_size=3) | ANY_JSON,
    "max_tokens": st.integers(-3, 40) | ANY_JSON,
    "temperature": st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1e-300, 1e300]) | ANY_JSON,
    "top_p": st.floats(allow_nan=True, allow_infinity=True) | ANY_JSON,
    "top_k": st.integers(-10, 10**9) | ANY_JSON,
    "seed": st.integers(-2**66, 2**66) | ANY_JSON,
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | ANY_JSON,
    "n": st.integers(-1, 3) | ANY_JSON,
    "stream": st.booleans() | ANY_JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | ANY_JSON,
    "ignore_eos": st.booleans() | ANY_JSON,
    "logprobs": st.integers(-2, 25) | st.booleans() | ANY_JSON,
    "top_logprobs": st.integers(-2, 25) | ANY_JSON,
    "echo": st.booleans() | ANY_JSON,
    "presence_penalty": st.floats(-3, 3) | ANY_JSON,
    "frequency_penalty": st.floats(-3, 3) | ANY_JSON,
    "min_tokens": st.integers(-2, 50) | ANY_JSON,
    "stop_token_ids": st.lists(st.integers(-5, 60000), max_size=4) | ANY_JSON,
    "model": st.sampled_from(["hybrid", "gpt-4"]) | ANY_JSON,
    "response_format": st.sampled_from([{"type": "text"}, {"type": "json_object"}]) | ANY_JSON,
    "tools": ANY_JSON,
    "user": ANY_TEXT | ANY_JSON,
    "pad": st.integers(0, 2 * LIMIT).map(lambda n: "x" * n),  # bodies up to and past the limit
}
BODIES = (st.fixed_dictionaries({}, optional=FIELDS).map(json.dumps).map(str.encode)
          | ANY_JSON.map(json.dumps).map(str.encode)
          | st.binary(max_size=120))
GOOD = {"prompt": "hi", "max_tokens": 1}


@pytest.fixture(scope="module")
def server():
    with thread_server(max_model_len=128, max_request_bytes=LIMIT) as url:  # valid requests end within 128 tokens
        yield url


@pytest.fixture(scope="module")
def keep_alive(server):
    """One client for every example: a connection the server reset would fail the next request."""
    with httpx.Client(base_url=server, timeout=60) as client:  # a hang fails as a timeout
        yield client


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=BODIES, endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_fuzzed_bodies_never_get_5xx_or_hang(keep_alive, body, endpoint):
    response = keep_alive.post(endpoint, content=body, headers={"content-type": "application/json"})
    assert response.status_code < 500, (body[:300], response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.json()["error"]["message"]
    assert keep_alive.post("/v1/completions", json=GOOD).status_code == 200


def test_after_fuzzing_nothing_is_held(server):
    assert metric(server, "infragent:kv_blocks_used") == 0 and metric(server, "infragent:state_slots_used") == 0
    assert metric(server, "infragent:requests_total", 'status="error"') == 0
