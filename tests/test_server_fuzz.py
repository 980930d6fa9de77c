"""Fuzz: Hypothesis writes request bodies; the server never answers 5xx and never hangs."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_fixture import metric, thread_server

SCALARS = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
           | st.text(max_size=40))
ANY_JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=12), inner, max_size=4), max_leaves=12)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant", "robot", ""]) | ANY_JSON,
                                 "content": st.text(max_size=80) | ANY_JSON})
FIELDS = {
    "prompt": st.text(max_size=200) | st.lists(st.integers(-5, 60000), max_size=30) | ANY_JSON,
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
}
BODIES = (st.fixed_dictionaries({}, optional=FIELDS).map(json.dumps).map(str.encode)
          | ANY_JSON.map(json.dumps).map(str.encode)
          | st.binary(max_size=120))


@pytest.fixture(scope="module")
def server():
    with thread_server(max_model_len=128) as url:  # any valid request ends within 128 tokens
        yield url


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(body=BODIES, endpoint=st.sampled_from(["/v1/completions", "/v1/chat/completions"]))
def test_fuzzed_bodies_never_get_5xx_or_hang(server, body, endpoint):
    response = httpx.post(server + endpoint, content=body, headers={"content-type": "application/json"},
                          timeout=60)  # a hang fails as a timeout
    assert response.status_code < 500, (body[:300], response.status_code, response.text[:300])
    if response.status_code >= 400:
        assert response.json()["error"]["message"]


def test_after_fuzzing_nothing_is_held(server):
    assert metric(server, "infragent:kv_blocks_used") == 0 and metric(server, "infragent:state_slots_used") == 0
    assert metric(server, "infragent:requests_total", 'status="error"') == 0
