"""The values each engine option may take, and the error a bad one raises. It imports nothing of the engine,
so that the config and the modules that implement each choice can both read it."""
from __future__ import annotations

MODELS = ("llama", "hybrid", "hybrid-moe")
ROUTER_SCORINGS = ("softmax", "sigmoid")  # hybrid-moe: how the router turns logits into expert scores
# expert parallelism's dispatch/combine: torch.distributed, or the shared-memory library (GIL released / held)
MOE_EXCHANGES = ("gloo", "native", "native-gil-held")
DTYPES = ("float32", "bfloat16")  # torch dtype names (torch is imported when the engine needs it)
KV_LAYOUTS = ("paged", "contiguous")
TOKENIZER_MODES = ("fast", "slow")
GEMMS = ("torch", "blas", "blas-gil-held")
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "fp8", "int8")  # auto: the model's dtype
QUANTIZATIONS = ("w8a8", "int8-weight")
SPECULATIVE = ("ngram", "draft")  # prompt lookup, or the model's own first layers as a draft model
ROLLBACKS = ("snapshot", "replayssm")
KERNEL_CHOICES = ("auto", "native", "torch")
DECODE_STACKS = ("auto", "off")  # decode-only steps through one native call where they can, or op by op
WEIGHT_FORMATS = ("auto", "fp32", "gguf", "gguf-a16", "gguf-a8", "int8")  # measured; the file's blocks
# dequantized at load, kept as stored (fp32 activations, or activations as two or one int8 digits), int8 per row
BLOCK_FORMATS = ("gguf", "gguf-a16", "gguf-a8")  # the formats that keep the model file's own blocks
KDA_DECODE_IMPLS = ("vectorized", "reference")
TRANSFER_MODES = ("layerwise", "after_prefill")
TRANSFER_IMPLS = ("serialize", "bulk")
PARTIAL_PRECISIONS = {"fp32": "fp32", "reduced": "bf16", "3-pass": "bf16x3"}  # name -> tensor-parallel sum mode


class ConfigError(ValueError):
    """A knob has a value the engine cannot run with; the message names the knob."""
