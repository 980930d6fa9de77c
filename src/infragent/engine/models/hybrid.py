"""The hybrid family: KDA and GQA attention layers in a configurable ratio, random init from a seed; hybrid-moe
adds mixture-of-experts feed-forward layers after the first dense ones."""
from __future__ import annotations

import math

import torch

from infragent.engine.config import HybridConfig
from infragent.engine.models.shape import ModelShape


def hybrid_shape(cfg: HybridConfig, vocab_size: int, moe: bool = False) -> ModelShape:
    """The architecture the hybrid config describes (with its MoE layers when moe)."""
    experts = dict(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
                   moe_intermediate_size=cfg.moe_intermediate_size,
                   shared_expert_intermediate_size=cfg.shared_expert_intermediate_size,
                   router_scoring=cfg.router_scoring, first_dense_layers=cfg.first_dense_layers,
                   router_skew=cfg.router_skew) if moe else {}
    return ModelShape(
        name="hybrid-moe" if moe else "hybrid", vocab_size=vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        layer_kinds=tuple(cfg.layer_kinds()), num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rope_theta=cfg.rope_theta, rms_eps=cfg.rms_eps,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        kda_num_heads=cfg.kda_num_heads, kda_head_k_dim=cfg.kda_head_k_dim, kda_head_v_dim=cfg.kda_head_v_dim,
        kda_chunk_size=cfg.kda_chunk_size, **experts)


def init_hybrid(cfg: HybridConfig, vocab_size: int, moe: bool = False) -> tuple[ModelShape, dict[str, torch.Tensor]]:
    """Random fp32 weights (HF-style names) for the hybrid model; the same seed gives the same model."""
    shape = hybrid_shape(cfg, vocab_size, moe)
    gen = torch.Generator().manual_seed(cfg.seed)

    def linear(out_features: int, in_features: int) -> torch.Tensor:
        return torch.randn(out_features, in_features, generator=gen) * (1.0 / math.sqrt(in_features))

    hid, inter = shape.hidden_size, shape.intermediate_size
    w: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": torch.randn(vocab_size, hid, generator=gen) * 0.02 * math.sqrt(hid) / 4,
        "model.norm.weight": torch.ones(hid),
    }
    for i, kind in enumerate(shape.layer_kinds):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = torch.ones(hid)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hid)
        if shape.is_moe_layer(i):
            w.update(moe_weights(shape, p + "mlp.", linear))
        else:
            w.update(mlp_weights(shape, p + "mlp.", inter, linear))
        if kind == "attention":
            h, kvh, d = shape.num_heads, shape.num_kv_heads, shape.head_dim
            w[p + "self_attn.q_proj.weight"] = linear(h * d, hid)
            w[p + "self_attn.k_proj.weight"] = linear(kvh * d, hid)
            w[p + "self_attn.v_proj.weight"] = linear(kvh * d, hid)
            w[p + "self_attn.o_proj.weight"] = linear(hid, h * d) / math.sqrt(2 * shape.num_layers)
        else:
            h, dk, dv = shape.kda_num_heads, shape.kda_head_k_dim, shape.kda_head_v_dim
            k = p + "kda."
            w[k + "q_proj.weight"] = linear(h * dk, hid)
            w[k + "k_proj.weight"] = linear(h * dk, hid)
            w[k + "v_proj.weight"] = linear(h * dv, hid)
            w[k + "g_proj.weight"] = linear(h * dk, hid)
            w[k + "b_proj.weight"] = linear(h, hid)
            w[k + "g_out_proj.weight"] = linear(h * dv, hid)
            w[k + "A_log"] = torch.empty(h).uniform_(0.0, math.log(16.0), generator=gen)
            dt = torch.exp(torch.empty(h * dk).uniform_(math.log(1e-3), math.log(1e-1), generator=gen))
            w[k + "dt_bias"] = dt + torch.log(-torch.expm1(-dt))  # inverse softplus
            w[k + "o_norm.weight"] = torch.ones(dv)
            w[k + "o_proj.weight"] = linear(hid, h * dv) / math.sqrt(2 * shape.num_layers)
    return shape, w


def mlp_weights(shape: ModelShape, prefix: str, inter: int, linear) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """A SwiGLU MLP's gate, up and down projections under prefix."""
    hid = shape.hidden_size
    return {prefix + "gate_proj.weight": linear(inter, hid), prefix + "up_proj.weight": linear(inter, hid),
            prefix + "down_proj.weight": linear(hid, inter) / math.sqrt(2 * shape.num_layers)}


def moe_weights(shape: ModelShape, prefix: str, linear) -> dict[str, torch.Tensor]:  # noqa: ANN001
    """An MoE layer's router (gate), experts and shared expert, named as Qwen2-MoE-style checkpoints do."""
    w = {prefix + "gate.weight": linear(shape.num_experts, shape.hidden_size)}
    if shape.router_skew:  # a load imbalance on purpose: later experts (later ranks) chosen more often
        w[prefix + "gate.e_score_correction_bias"] = torch.linspace(0.0, shape.router_skew, shape.num_experts)
    for e in range(shape.num_experts):
        w.update(mlp_weights(shape, f"{prefix}experts.{e}.", shape.moe_intermediate_size, linear))
    if shape.shared_expert_intermediate_size:
        w.update(mlp_weights(shape, prefix + "shared_expert.", shape.shared_expert_intermediate_size, linear))
    return w
