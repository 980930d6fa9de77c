"""Which slice of every weight a tensor-parallel rank holds (HF names in, HF names out).

Attention is split by KV-head group (a rank holds whole GQA groups, so uneven splits such as SmolLM2's
3 KV heads over 2 ranks work: 2 groups and 1); KDA by head; the MLP's gate and up by intermediate rows
(column-parallel) and down by the matching input columns (row-parallel); the LM head by vocabulary rows.
Embedding and norms are replicated. A rank's ModelShape has its local head counts.
"""
from __future__ import annotations

from dataclasses import replace

import torch

from infragent.engine.models.shape import ModelShape


def bounds(size: int, world: int, rank: int) -> tuple[int, int]:
    """[start, stop) of rank's share of size items split as evenly as possible (earlier ranks get more)."""
    base, extra = divmod(size, world)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def shard_weights(shape: ModelShape, weights: dict[str, torch.Tensor], rank: int,
                  world: int) -> tuple[ModelShape, dict[str, torch.Tensor]]:
    """(local shape, local weights) of one rank."""
    for name, count in (("num_kv_heads", shape.num_kv_heads), ("intermediate_size", shape.intermediate_size),
                        ("vocab_size", shape.vocab_size)):
        if count < world:
            raise ValueError(f"tensor_parallel_size: {world} ranks cannot split {count} {name}")
    if shape.num_kda_layers and shape.kda_num_heads < world:
        raise ValueError(f"tensor_parallel_size: {world} ranks cannot split {shape.kda_num_heads} KDA heads")
    group = shape.num_heads // shape.num_kv_heads
    kv0, kv1 = bounds(shape.num_kv_heads, world, rank)
    h0, h1 = kv0 * group, kv1 * group
    i0, i1 = bounds(shape.intermediate_size, world, rank)
    v0, v1 = bounds(shape.vocab_size, world, rank)
    k0, k1 = bounds(shape.kda_num_heads, world, rank) if shape.num_kda_layers else (0, 0)
    d, dk, dv = shape.head_dim, shape.kda_head_k_dim, shape.kda_head_v_dim
    rows = {"self_attn.q_proj": (h0 * d, h1 * d), "self_attn.k_proj": (kv0 * d, kv1 * d),
            "self_attn.v_proj": (kv0 * d, kv1 * d), "mlp.gate_proj": (i0, i1), "mlp.up_proj": (i0, i1),
            "kda.q_proj": (k0 * dk, k1 * dk), "kda.k_proj": (k0 * dk, k1 * dk), "kda.g_proj": (k0 * dk, k1 * dk),
            "kda.v_proj": (k0 * dv, k1 * dv), "kda.g_out_proj": (k0 * dv, k1 * dv), "kda.b_proj": (k0, k1),
            "kda.A_log": (k0, k1), "kda.dt_bias": (k0 * dk, k1 * dk)}
    cols = {"self_attn.o_proj": (h0 * d, h1 * d), "mlp.down_proj": (i0, i1), "kda.o_proj": (k0 * dv, k1 * dv)}
    local: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        key = ".".join(name.split(".")[3:5]).removesuffix(".weight") if name.startswith("model.layers.") else ""
        if key in rows:
            a, b = rows[key]
            local[name] = tensor[a:b].clone()
        elif key in cols:
            a, b = cols[key]
            local[name] = tensor[:, a:b].contiguous()
        else:
            local[name] = tensor
    head = weights["model.embed_tokens.weight"] if shape.tie_word_embeddings else weights["lm_head.weight"]
    local["lm_head.weight"] = head[v0:v1].clone()
    local_shape = replace(shape, num_heads=h1 - h0, num_kv_heads=kv1 - kv0, kda_num_heads=k1 - k0,
                         intermediate_size=i1 - i0, tie_word_embeddings=False)
    return local_shape, local
