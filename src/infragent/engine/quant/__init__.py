"""Quantization: int8/fp8 formats, W8A8 and weight-only int8 linears, SmoothQuant, a per-layer KV cache dtype."""
