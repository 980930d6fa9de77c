"""EngineConfig: every engine knob in one typed, validated place."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import torch

MODELS = ("llama", "hybrid")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KV_LAYOUTS = ("paged", "contiguous")
GEMMS = ("torch", "blas", "blas-gil-held")
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "fp8", "int8")  # auto: the model's dtype
QUANTIZATIONS = ("w8a8", "int8-weight")
SPECULATIVE = ("ngram", "draft")  # prompt lookup, or the model's own first layers as a draft model
ROLLBACKS = ("snapshot", "replayssm")


class ConfigError(ValueError):
    """A knob has a value the engine cannot run with; the message names the knob."""


@dataclass
class HybridConfig:
    """Sizes of the random-init hybrid KDA/attention model (defaults fit a CPU)."""

    hidden_size: int = 512
    intermediate_size: int = 1536
    num_layers: int = 8
    kda_per_attention: int = 3  # layers come in groups: this many KDA layers, then one attention
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 64
    kda_num_heads: int = 8
    kda_head_k_dim: int = 64
    kda_head_v_dim: int = 64
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    max_position_embeddings: int = 8192
    seed: int = 0
    kda_chunk_size: int = 32

    def layer_kinds(self) -> list[str]:
        """Return 'kda' or 'attention' for each layer, in order."""
        period = self.kda_per_attention + 1
        return ["attention" if (i + 1) % period == 0 else "kda" for i in range(self.num_layers)]


@dataclass
class EngineConfig:
    """The engine's launch knobs (names follow vLLM where one exists)."""

    model: str = "llama"
    dtype: str = "float32"
    block_size: int = 16
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 32
    max_model_len: int | None = None  # None: min(model context, 4096)
    kv_cache_gb: float = 0.5
    kv_layout: str = "paged"
    enable_prefix_caching: bool | None = None  # None: on where the model allows it (no KDA state)
    num_threads: int | None = None  # None: all cores
    gguf_path: str | None = None
    gemm: str = "torch"  # torch | blas | blas-gil-held (native BLAS through ctypes, see native_gemm.py)
    kernels: str = "auto"  # native (C++: paged attention, fused norms; kernels/), torch (torch ops), auto: native where it applies
    kv_transfer: bool = False  # send each prefill layer's K/V to a KV store on a transfer thread
    kv_transfer_mode: str = "layerwise"  # layerwise (as each layer finishes) or after_prefill
    kv_transfer_impl: str = "serialize"  # serialize (per-block packing in Python) or bulk (native copies)
    kv_cache_dtype: str = "auto"  # every attention layer's KV storage: auto (model dtype), fp32, bf16, fp8, int8
    kv_cache_dtypes: list[str] | None = None  # one per attention layer, in order (overrides kv_cache_dtype)
    quantization: str | None = None  # w8a8 or int8-weight: the projections (not the LM head)
    smoothquant_alpha: float | None = None  # w8a8 only: migrate activation scale to weights (SmoothQuant α)
    kda_decode_impl: str = "vectorized"  # KDA decode step: vectorized (tiling knobs below) or reference loop
    kda_bv_tile: int | None = None  # V tile width of the vectorized step (None: whole V)
    kda_head_split: int = 1  # head groups of the vectorized step
    tensor_parallel_size: int = 1  # ranks (processes, gloo) sharing every layer by heads / features / vocab
    tp_partial_precision: str = "fp32"  # row-parallel partial sums: fp32, reduced (bf16 operands), 3-pass
    pipeline_parallel_size: int = 1  # stages (processes) holding consecutive runs of layers
    pp_micro_batches: int = 2  # a step's sequences split into this many groups flowing through the stages
    speculative: str | None = None  # ngram: draft by prompt lookup, verify greedily in one forward
    num_speculative_tokens: int = 3
    prompt_lookup_max: int = 4  # longest tail n-gram the drafter looks up
    prompt_lookup_min: int = 2  # a single repeated token is weak evidence: most such drafts are rejected
    draft_layers: int = 2  # speculative draft: the target's first layers (+ final norm and LM head)
    draft_window: int = 64  # tokens the draft model re-reads per draft token (it keeps no cache)
    rollback: str = "snapshot"  # KDA state after rejected drafts: snapshot per token, or replayssm
    rollback_window: int | None = None  # tokens a rollback covers (ReplaySSM ring length); None: drafts + 1
    hybrid: HybridConfig = field(default_factory=HybridConfig)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"model: unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if self.gemm not in GEMMS:
            raise ConfigError(f"gemm: {self.gemm!r}; choose one of {', '.join(GEMMS)}")
        if self.gemm != "torch" and self.dtype != "float32":
            raise ConfigError(f"gemm: {self.gemm} runs fp32 only; use dtype float32 or gemm torch")
        from infragent.engine.kernels.build import KERNEL_CHOICES

        if self.kernels not in KERNEL_CHOICES:
            raise ConfigError(f"kernels: {self.kernels!r}; choose one of {', '.join(KERNEL_CHOICES)}")
        if self.kv_layout not in KV_LAYOUTS:
            raise ConfigError(f"kv_layout: {self.kv_layout!r}; choose one of {', '.join(KV_LAYOUTS)}")
        for name in ("block_size", "max_num_batched_tokens", "max_num_seqs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ConfigError(f"max_model_len: must be positive, got {self.max_model_len}")
        if self.kv_cache_gb <= 0:
            raise ConfigError(f"kv_cache_gb: must be positive, got {self.kv_cache_gb}")
        self._check_quantization()
        self._check_speculative()
        self._check_kda_decode()
        self._check_parallel()
        self._check_transfer()
        if self.num_threads is not None and self.num_threads < 1:
            raise ConfigError(f"num_threads: must be >= 1, got {self.num_threads}")

    def _check_quantization(self) -> None:
        if self.quantization == "none":
            self.quantization = None
        for i, name in enumerate([self.kv_cache_dtype, *(self.kv_cache_dtypes or [])]):
            if name not in KV_CACHE_DTYPES:
                where = "kv_cache_dtype" if i == 0 else f"kv_cache_dtypes[{i - 1}]"
                raise ConfigError(f"{where}: {name!r}; choose one of {', '.join(KV_CACHE_DTYPES)}")
        used = self.kv_cache_dtypes if self.kv_cache_dtypes is not None else [self.kv_cache_dtype]
        if self.kv_layout != "paged" and set(used) - {"auto"}:
            raise ConfigError("kv_cache_dtype: a KV dtype other than auto needs kv_layout paged (scales are per block)")
        if self.quantization is not None:
            if self.quantization not in QUANTIZATIONS:
                raise ConfigError(f"quantization: {self.quantization!r}; choose one of {', '.join(QUANTIZATIONS)}")
            if self.gemm != "torch" or self.dtype != "float32":
                raise ConfigError("quantization: needs gemm torch and dtype float32 (it replaces the projections)")
        if self.smoothquant_alpha is not None:
            if self.quantization != "w8a8":
                raise ConfigError("smoothquant_alpha: applies to quantization w8a8 only; set it or drop alpha")
            if not 0.0 <= self.smoothquant_alpha <= 1.0:
                raise ConfigError(f"smoothquant_alpha: must be in [0, 1], got {self.smoothquant_alpha}")

    def _check_kda_decode(self) -> None:
        from infragent.engine.models.kda_ops import KDA_DECODE_IMPLS

        if self.kda_decode_impl not in KDA_DECODE_IMPLS:
            raise ConfigError(f"kda_decode_impl: {self.kda_decode_impl!r}; choose one of {', '.join(KDA_DECODE_IMPLS)}")
        if self.kda_bv_tile is not None and (not isinstance(self.kda_bv_tile, int) or self.kda_bv_tile < 1):
            raise ConfigError(f"kda_bv_tile: must be a positive integer or None, got {self.kda_bv_tile!r}")
        heads = self.hybrid.kda_num_heads
        if not isinstance(self.kda_head_split, int) or self.kda_head_split < 1 or heads % self.kda_head_split:
            raise ConfigError(f"kda_head_split: {self.kda_head_split!r} must divide the {heads} KDA heads")

    def _check_transfer(self) -> None:
        from infragent.engine.kv_transfer import TRANSFER_IMPLS, TRANSFER_MODES

        for name, allowed in (("kv_transfer_mode", TRANSFER_MODES), ("kv_transfer_impl", TRANSFER_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: {getattr(self, name)!r}; choose one of {', '.join(allowed)}")

    def _check_parallel(self) -> None:
        from infragent.engine.parallel.layers import PARTIAL_PRECISIONS

        for name in ("tensor_parallel_size", "pipeline_parallel_size", "pp_micro_batches"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ConfigError("pipeline_parallel_size: does not combine with tensor_parallel_size > 1 yet; "
                              "choose one")
        if self.tp_partial_precision not in PARTIAL_PRECISIONS:
            raise ConfigError(f"tp_partial_precision: {self.tp_partial_precision!r}; choose one of "
                              f"{', '.join(PARTIAL_PRECISIONS)}")
        world = max(self.tensor_parallel_size, self.pipeline_parallel_size)
        if world > 1:
            clash = [name for name, on in (("speculative", self.speculative), ("quantization", self.quantization),
                                           ("kv_transfer", self.kv_transfer), ("gemm", self.gemm != "torch"),
                                           ("kv_cache_dtypes", self.kv_cache_dtypes is not None
                                            and self.pipeline_parallel_size > 1))
                     if on]
            if clash:
                what = "tensor" if self.tensor_parallel_size > 1 else "pipeline"
                raise ConfigError(f"{what}_parallel_size: {world} does not combine with {', '.join(clash)} yet; "
                                  f"use one rank or turn them off")

    def _check_speculative(self) -> None:
        if self.speculative == "none":
            self.speculative = None
        if self.speculative is not None and self.speculative not in SPECULATIVE:
            raise ConfigError(f"speculative: {self.speculative!r}; choose one of {', '.join(SPECULATIVE)}")
        if self.rollback not in ROLLBACKS:
            raise ConfigError(f"rollback: {self.rollback!r}; choose one of {', '.join(ROLLBACKS)}")
        for name in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min", "draft_layers",
                     "draft_window"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"prompt_lookup_min: {self.prompt_lookup_min} is above prompt_lookup_max "
                              f"{self.prompt_lookup_max}")
        if self.rollback_window is not None and self.rollback_window < self.num_speculative_tokens + 1:
            raise ConfigError(f"rollback_window: {self.rollback_window} cannot hold a verification of "
                              f"{self.num_speculative_tokens} drafts + 1; use at least {self.num_speculative_tokens + 1}")

    def resolved_rollback_window(self) -> int:
        """Tokens one rollback covers: rollback_window, or the drafts plus the token they follow."""
        return self.rollback_window or self.num_speculative_tokens + 1

    def layer_kv_dtypes(self, num_attention_layers: int) -> list[str]:
        """The KV dtype of each attention layer ("auto" resolved later to the model dtype)."""
        if self.kv_cache_dtypes is None:
            return [self.kv_cache_dtype] * num_attention_layers
        if len(self.kv_cache_dtypes) != num_attention_layers:
            raise ConfigError(f"kv_cache_dtypes: has {len(self.kv_cache_dtypes)} entries for "
                              f"{num_attention_layers} attention layers; give one per attention layer")
        return list(self.kv_cache_dtypes)

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of weights and activations."""
        return DTYPES[self.dtype]

    def resolved_threads(self) -> int:
        """Threads torch should use."""
        ranks = self.tensor_parallel_size * self.pipeline_parallel_size
        return self.num_threads or max(1, len(os.sched_getaffinity(0)) // ranks)
