"""Swap a model's linears for quantized ones: W8A8 or int8-weight projections (the LM head and embedding stay
in the model dtype), or every weight stored as int8 per row (weight_format int8)."""
from __future__ import annotations

import torch

from infragent.engine.quant.blocks import BlockLinear, quantize_int8
from infragent.engine.quant.linear import Int8WeightLinear, W8A8Linear


def quantize_projections(model, method: str, smooth: list[torch.Tensor] | None = None) -> None:
    """Replace every projection of model by method's linear ("w8a8" or "int8-weight"), in place."""
    for i, (owner, name) in enumerate(model.projections()):
        weight_t = getattr(owner, name).weight_t
        if method == "w8a8":
            quantized = W8A8Linear(weight_t, smooth[i] if smooth is not None else None)
        elif method == "int8-weight":
            quantized = Int8WeightLinear(weight_t)
        else:
            raise ValueError(f"quantization: {method!r}; choose w8a8 or int8-weight")
        setattr(owner, name, quantized)


def store_int8(model) -> None:
    """Every linear of model (projections, LM head) and its embedding held as int8 with one scale per output
    row, in place; a tied LM head shares the embedding's int8 rows."""
    for owner, name in model.projections():
        setattr(owner, name, BlockLinear(quantize_int8(getattr(owner, name).weight_t.t()), native=False))
    model.embed = quantize_int8(model.embed)
    head = model.embed if model.shape.tie_word_embeddings else quantize_int8(model.lm_head.weight_t.t())
    model.lm_head = BlockLinear(head, native=False)
