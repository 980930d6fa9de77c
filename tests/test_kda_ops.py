"""KDA kernels: recurrent vs a naive reference, chunked vs recurrent, state hand-off, decode, gate."""
from __future__ import annotations

import importlib.util
import os
import sys
import types

import pytest
import torch
from kda_reference import ref_gate, ref_kda, ref_normalize

from infragent.engine.models.kda_ops import (
    kda_chunked,
    kda_decode_step,
    kda_gate,
    kda_recurrent,
    l2_normalize,
)

ATOL = 1e-5


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny ops only: with 2 threads on a busy host, each call can stall for milliseconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_inputs(T: int, H: int, dk: int, dv: int, decay: float = 1.0, seed: int = 0, B: int | None = None):
    """Random q, k, v, g in [-1.5 decay, -0.5 decay] and beta in [0.01, 1): [T,(B,)H,...]."""
    gen = torch.Generator().manual_seed(seed)
    lead = (T,) if B is None else (T, B)
    q = torch.randn(*lead, H, dk, generator=gen)
    k = torch.randn(*lead, H, dk, generator=gen)
    v = torch.randn(*lead, H, dv, generator=gen)
    g = -decay * (0.5 + torch.rand(*lead, H, dk, generator=gen))
    beta = torch.rand(*lead, H, generator=gen).clamp_min(0.01)
    return q, k, v, g, beta


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, in fp32."""
    return (a.float() - b.float()).abs().max().item()


def test_gate_formula_and_sign():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 3, 8, generator=gen) * 4
    A_log = torch.randn(3, generator=gen)
    dt_bias = torch.randn(3, 8, generator=gen)
    g = kda_gate(x, A_log, dt_bias)
    assert g.dtype == torch.float32 and g.shape == x.shape
    assert (g <= 0).all()
    assert torch.allclose(g, ref_gate(x, A_log, dt_bias), rtol=1e-5, atol=1e-6)
    alt = kda_gate(x.bfloat16(), A_log.view(3, 1), dt_bias.reshape(24))
    assert alt.dtype == torch.float32
    assert torch.allclose(alt, ref_gate(x.bfloat16().float(), A_log, dt_bias), rtol=1e-5, atol=1e-6)


def test_l2_normalize():
    x = torch.randn(4, 3, 16)
    assert max_err(l2_normalize(x), ref_normalize(x)) < 1e-6
    assert l2_normalize(x.bfloat16()).dtype == torch.float32


SHAPES = [(1, 1, 16, 32), (7, 2, 16, 32), (33, 3, 16, 32), (100, 4, 16, 32), (33, 2, 32, 16)]


@pytest.mark.parametrize("T,H,dk,dv", SHAPES)
@pytest.mark.parametrize("with_state", [False, True])
def test_recurrent_matches_reference(T, H, dk, dv, with_state):
    q, k, v, g, beta = make_inputs(T, H, dk, dv, seed=T + H)
    s0 = torch.randn(H, dk, dv) if with_state else None
    o, s = kda_recurrent(q, k, v, g, beta, initial_state=s0)
    o_ref, s_ref = ref_kda(q, k, v, g, beta, initial_state=s0)
    assert o.shape == (T, H, dv) and s.shape == (H, dk, dv)
    assert max_err(o, o_ref) < ATOL and max_err(s, s_ref) < ATOL


def test_recurrent_options_match_reference():
    q, k, v, g, beta = make_inputs(20, 2, 16, 32, seed=5)
    o, s = kda_recurrent(q, k, v, g, beta, scale=0.3, normalize_qk=False)
    o_ref, s_ref = ref_kda(q, k, v, g, beta, scale=0.3, normalize_qk=False)
    assert max_err(o, o_ref) < 1e-4 * (1 + o_ref.abs().max().item())
    assert max_err(s, s_ref) < 1e-4 * (1 + s_ref.abs().max().item())


@pytest.mark.parametrize("decay", [1.0, 5.0, 1e-3])
@pytest.mark.parametrize("chunk_size", [1, 4, 16, 32, 64])
@pytest.mark.parametrize("T", [1, 7, 33, 100])
def test_chunked_matches_recurrent(decay, chunk_size, T):
    H, dk, dv = 3, 16, 32
    q, k, v, g, beta = make_inputs(T, H, dk, dv, decay=decay, seed=T)
    s0 = torch.randn(H, dk, dv)
    o_r, s_r = kda_recurrent(q, k, v, g, beta, initial_state=s0)
    o_c, s_c = kda_chunked(q, k, v, g, beta, initial_state=s0, chunk_size=chunk_size)
    assert max_err(o_c, o_r) < ATOL and max_err(s_c, s_r) < ATOL


def test_chunked_long_and_extreme_decay():
    q, k, v, g, beta = make_inputs(700, 2, 32, 32, seed=9)
    g[100:200] = -60.0  # exp(-60 * 32) would overflow any exp(G) * exp(-G) factorization
    o_r, s_r = kda_recurrent(q, k, v, g, beta)
    o_c, s_c = kda_chunked(q, k, v, g, beta, chunk_size=32)
    assert torch.isfinite(o_c).all() and torch.isfinite(s_c).all()
    assert max_err(o_c, o_r) < ATOL and max_err(s_c, s_r) < ATOL


def test_chunked_options_and_dtype():
    q, k, v, g, beta = make_inputs(45, 2, 16, 16, seed=3)
    o_r, _ = kda_recurrent(q, k, v, g, beta, scale=0.5, normalize_qk=False)
    o_c, _ = kda_chunked(q, k, v, g, beta, scale=0.5, normalize_qk=False, chunk_size=16)
    assert max_err(o_c, o_r) < 1e-4 * (1 + o_r.abs().max().item())
    qb, kb, vb = q.bfloat16(), k.bfloat16(), v.bfloat16()
    o_b, s_b = kda_chunked(qb, kb, vb, g, beta, chunk_size=16)
    o_f, s_f = kda_recurrent(qb.float(), kb.float(), vb.float(), g, beta)
    assert o_b.dtype == torch.bfloat16 and s_b.dtype == torch.float32
    assert max_err(o_b, o_f) < 2e-2 and max_err(s_b, s_f) < ATOL


@pytest.mark.parametrize("fn", [kda_recurrent, kda_chunked])
@pytest.mark.parametrize("split", [1, 17, 64])
def test_prefix_then_suffix_equals_one_call(fn, split):
    q, k, v, g, beta = make_inputs(90, 2, 16, 32, seed=11)
    s0 = torch.randn(2, 16, 32)
    o_all, s_all = fn(q, k, v, g, beta, initial_state=s0)
    a, b = slice(0, split), slice(split, None)
    o1, s1 = fn(q[a], k[a], v[a], g[a], beta[a], initial_state=s0)
    o2, s2 = fn(q[b], k[b], v[b], g[b], beta[b], initial_state=s1)
    assert max_err(torch.cat((o1, o2)), o_all) < ATOL and max_err(s2, s_all) < ATOL


def test_initial_state_not_mutated():
    q, k, v, g, beta = make_inputs(10, 2, 16, 16)
    s0 = torch.randn(2, 16, 16)
    keep = s0.clone()
    kda_recurrent(q, k, v, g, beta, initial_state=s0)
    kda_chunked(q, k, v, g, beta, initial_state=s0, chunk_size=4)
    assert torch.equal(s0, keep)


def test_decode_steps_match_recurrent():
    T, H, dk, dv = 23, 3, 16, 32
    q, k, v, g, beta = make_inputs(T, H, dk, dv, seed=4)
    s0 = torch.randn(H, dk, dv)
    state = s0.clone().unsqueeze(0)
    outs = [kda_decode_step(*(x[t, None] for x in (q, k, v, g, beta)), state) for t in range(T)]
    o_r, s_r = kda_recurrent(q, k, v, g, beta, initial_state=s0)
    assert max_err(torch.cat(outs), o_r) < ATOL and max_err(state[0], s_r) < ATOL


def test_batched_decode_matches_per_sequence():
    T, B, H, dk, dv = 9, 3, 2, 16, 32
    q, k, v, g, beta = make_inputs(T, H, dk, dv, seed=6, B=B)
    s0 = torch.randn(B, H, dk, dv)
    state = s0.clone()
    outs = torch.stack([kda_decode_step(q[t], k[t], v[t], g[t], beta[t], state) for t in range(T)])
    for i in range(B):
        o_r, s_r = kda_recurrent(q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i], initial_state=s0[i])
        assert max_err(outs[:, i], o_r) < ATOL and max_err(state[i], s_r) < ATOL


def test_decode_keeps_input_dtype_and_rejects_bad_state():
    q, k, v, g, beta = make_inputs(1, 2, 16, 16, B=2)
    state = torch.zeros(2, 2, 16, 16)
    o = kda_decode_step(q[0].bfloat16(), k[0].bfloat16(), v[0].bfloat16(), g[0], beta[0], state)
    assert o.dtype == torch.bfloat16 and state.dtype == torch.float32
    with pytest.raises(ValueError):
        kda_decode_step(q[0], k[0], v[0], g[0], beta[0], state.double())


def _load_fla_naive(path: str):
    """Import fla/ops/kda/naive.py alone (no fla package, no triton); stub einops while it loads if absent."""
    stubbed = importlib.util.find_spec("einops") is None and "einops" not in sys.modules
    if stubbed:
        stub = types.ModuleType("einops")
        stub.rearrange = None  # only naive_chunk_kda uses it
        sys.modules["einops"] = stub
    try:
        spec = importlib.util.spec_from_file_location("fla_kda_naive", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        if stubbed:
            del sys.modules["einops"]
    return module.naive_recurrent_kda


@pytest.mark.skipif(not os.environ.get("FLA_KDA_NAIVE"), reason="set FLA_KDA_NAIVE to fla/ops/kda/naive.py")
def test_agrees_with_fla_naive_recurrent():
    naive = _load_fla_naive(os.environ["FLA_KDA_NAIVE"])
    T, H, dk, dv = 37, 3, 16, 32
    q, k, v, g, beta = make_inputs(T, H, dk, dv, seed=8)
    s0 = torch.randn(H, dk, dv)
    # fla takes [B,T,H,D], does not normalize q/k itself, and scales q by dk**-0.5 by default.
    qn, kn = l2_normalize(q), l2_normalize(k)
    o_f, s_f = naive(
        qn[None], kn[None], v[None], g[None], beta[None], initial_state=s0[None], output_final_state=True
    )
    o_c, s_c = kda_chunked(q, k, v, g, beta, initial_state=s0, chunk_size=16)
    assert max_err(o_c, o_f[0]) < ATOL and max_err(s_c, s_f[0]) < ATOL
