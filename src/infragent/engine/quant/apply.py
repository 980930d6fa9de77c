"""Swap a model's projection linears for quantized ones (the LM head and embedding stay in the model dtype)."""
from __future__ import annotations

import torch

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
