"""The llama family: SmolLM2-135M-Instruct read from its GGUF file."""
from __future__ import annotations

from pathlib import Path

import torch

from infragent.engine.gguf_weights import GGUFFile, LlamaGGUFConfig, load_llama_gguf
from infragent.engine.models.shape import ModelShape
from infragent.engine.quant.blocks import BlockWeight


def llama_shape(cfg: LlamaGGUFConfig) -> ModelShape:
    """The architecture a GGUF llama config describes."""
    return ModelShape(
        name="llama", vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, layer_kinds=("attention",) * cfg.num_layers,
        num_heads=cfg.num_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
        rope_theta=cfg.rope_theta, rms_eps=cfg.rms_eps, max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings)


def load_llama(path: str | Path | GGUFFile | None = None,
               blocks: bool = False) -> tuple[ModelShape, dict[str, torch.Tensor | BlockWeight]]:
    """Shape and weights (HF names) of the GGUF llama model: fp32, or (blocks) the quantized tensors as stored."""
    cfg, weights = load_llama_gguf(path, blocks=blocks)
    return llama_shape(cfg), weights
