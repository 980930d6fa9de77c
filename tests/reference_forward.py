"""A naive full-recompute forward (no cache, no batching), written independently of the engine.

Used only by tests: the engine's cached, batched, chunked execution must reproduce it.
"""
from __future__ import annotations

import torch

from kda_reference import ref_gate, ref_kda


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [T, heads, d]; rotate pairs (i, i + d/2) by angle pos * theta^(-2i/d)."""
    t, _, d = x.shape
    half = d // 2
    freqs = theta ** (-torch.arange(half, dtype=torch.float64) * 2 / d)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * freqs[None, :]
    cos, sin = ang.cos().float()[:, None, :], ang.sin().float()[:, None, :]
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


def _attention(spec, w: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    t = x.shape[0]
    h, kvh, d = spec.num_heads, spec.num_kv_heads, spec.head_dim
    q = _rope((x @ w[p + "self_attn.q_proj.weight"].T).view(t, h, d), spec.rope_theta)
    k = _rope((x @ w[p + "self_attn.k_proj.weight"].T).view(t, kvh, d), spec.rope_theta)
    v = (x @ w[p + "self_attn.v_proj.weight"].T).view(t, kvh, d)
    out = torch.zeros(t, h, d)
    causal = torch.ones(t, t).tril().bool()
    for head in range(h):
        kv = head // (h // kvh)
        scores = (q[:, head] @ k[:, kv].T) / d ** 0.5
        scores = scores.masked_fill(~causal, float("-inf"))
        out[:, head] = torch.softmax(scores, dim=-1) @ v[:, kv]
    return out.reshape(t, h * d) @ w[p + "self_attn.o_proj.weight"].T


def _kda(spec, w: dict, p: str, x: torch.Tensor) -> torch.Tensor:
    t = x.shape[0]
    h, dk, dv = spec.kda_num_heads, spec.kda_head_k_dim, spec.kda_head_v_dim
    k_ = p + "kda."
    q = (x @ w[k_ + "q_proj.weight"].T).view(t, h, dk)
    k = (x @ w[k_ + "k_proj.weight"].T).view(t, h, dk)
    v = (x @ w[k_ + "v_proj.weight"].T).view(t, h, dv)
    g = ref_gate((x @ w[k_ + "g_proj.weight"].T).view(t, h, dk), w[k_ + "A_log"], w[k_ + "dt_bias"])
    beta = torch.sigmoid(x @ w[k_ + "b_proj.weight"].T)
    o, _ = ref_kda(q, k, v, g, beta)
    gate = torch.sigmoid((x @ w[k_ + "g_out_proj.weight"].T).view(t, h, dv))
    o = _rms(o, w[k_ + "o_norm.weight"], spec.rms_eps) * gate
    return o.reshape(t, h * dv) @ w[k_ + "o_proj.weight"].T


def reference_logits(spec, w: dict, token_ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] of every position of token_ids, computed from scratch in fp32."""
    x = w["model.embed_tokens.weight"][torch.tensor(token_ids)].float()
    for i, kind in enumerate(spec.layer_kinds):
        p = f"model.layers.{i}."
        normed = _rms(x, w[p + "input_layernorm.weight"], spec.rms_eps)
        x = x + (_attention(spec, w, p, normed) if kind == "attention" else _kda(spec, w, p, normed))
        normed = _rms(x, w[p + "post_attention_layernorm.weight"], spec.rms_eps)
        gate = normed @ w[p + "mlp.gate_proj.weight"].T
        up = normed @ w[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    head = w["model.embed_tokens.weight"] if spec.tie_word_embeddings else w["lm_head.weight"]
    return _rms(x, w["model.norm.weight"], spec.rms_eps) @ head.T


def reference_greedy(spec, w: dict, prompt: list[int], max_tokens: int) -> list[int]:
    """Greedy decoding by recomputing the whole sequence for every new token."""
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(int(reference_logits(spec, w, tokens)[-1].argmax()))
    return tokens[len(prompt):]
