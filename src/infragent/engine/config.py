"""EngineConfig: every engine knob in one typed, validated place."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from infragent.engine.options import (BLOCK_FORMATS, DECODE_STACKS, DTYPES, GEMMS, KDA_DECODE_IMPLS, KERNEL_CHOICES,  # noqa: F401
                                      KV_CACHE_DTYPES, KV_LAYOUTS, MODELS, MOE_EXCHANGES, PARTIAL_PRECISIONS,
                                      QUANTIZATIONS, ROLLBACKS, ROUTER_SCORINGS, SPECULATIVE, TRANSFER_IMPLS,
                                      TOKENIZER_MODES, TRANSFER_MODES, WEIGHT_FORMATS, ConfigError)


def _knob(default: Any, flag: str, help: str, *aliases: str) -> Any:
    """A launch knob field: its `infragent serve` flag, aliases and help ride in the field's metadata
    (engine/knobs.py builds the command line from them)."""
    return field(default=default, metadata={"flag": flag, "aliases": aliases, "help": help})


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
    # model hybrid-moe only: MoE feed-forward layers after the first `first_dense_layers` (dense, as GLM- and
    # Kimi-Linear-class models place them)
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 384
    shared_expert_intermediate_size: int = 384  # 0: no shared expert
    router_scoring: str = "softmax"  # or sigmoid
    first_dense_layers: int = 1
    router_skew: float = 0.0  # > 0: a routing bias rising to this at the last expert (an expert-load imbalance)

    def check_moe(self) -> None:
        """ConfigError naming the hybrid field whose MoE value cannot build a model."""
        if self.num_experts < 1:
            raise ConfigError(f"hybrid.num_experts: {self.num_experts} must be at least 1")
        if not 1 <= self.num_experts_per_tok <= self.num_experts:
            raise ConfigError(f"hybrid.num_experts_per_tok: {self.num_experts_per_tok} must be between 1 and "
                              f"num_experts ({self.num_experts})")
        if self.router_scoring not in ROUTER_SCORINGS:
            raise ConfigError(f"hybrid.router_scoring: {self.router_scoring!r}; choose one of "
                              f"{', '.join(ROUTER_SCORINGS)}")
        if not 0 <= self.first_dense_layers <= self.num_layers:
            raise ConfigError(f"hybrid.first_dense_layers: {self.first_dense_layers} must be between 0 and "
                              f"num_layers ({self.num_layers})")
        for name in ("moe_intermediate_size", "shared_expert_intermediate_size"):
            if getattr(self, name) < (1 if name == "moe_intermediate_size" else 0):
                raise ConfigError(f"hybrid.{name}: {getattr(self, name)} is too small")

    def layer_kinds(self) -> list[str]:
        """Return 'kda' or 'attention' for each layer, in order."""
        period = self.kda_per_attention + 1
        return ["attention" if (i + 1) % period == 0 else "kda" for i in range(self.num_layers)]


@dataclass
class EngineConfig:
    """The engine's launch knobs (names follow vLLM where one exists); model, gguf_path and hybrid are set
    by their own options, every other field is a knob of engine/knobs.py."""

    model: str = "llama"
    dtype: str = _knob("float32", "--dtype", "Weights and activations: float32 or bfloat16.")
    block_size: int = _knob(16, "--block-size", "Tokens per KV cache block (paged layout).")
    max_num_batched_tokens: int = _knob(512, "--max-num-batched-tokens", "Most tokens one engine step schedules "
                                        "(prefill chunks and decodes together).")
    max_num_seqs: int = _knob(32, "--max-num-seqs", "Most sequences running at once.")
    max_model_len: int | None = _knob(None, "--max-model-len", "Context length in tokens (default: min(the "
                                      "model's context, 4096)).")
    kv_cache_gb: float = _knob(0.5, "--kv-cache-gb", "Most GB of memory for the attention KV cache (resident "
                               "only as blocks are first used; freed blocks are reused before unused ones).")
    kv_layout: str = _knob("paged", "--kv-layout", "paged or contiguous.")
    tokenizer_mode: str = _knob("fast", "--tokenizer-mode", "fast (native BPE merges) or slow (the merges in "
                                "Python, holding the GIL, as transformers' slow tokenizers; vLLM's flag).")
    enable_prefix_caching: bool | None = _knob(None, "--enable-prefix-caching", "Reuse the KV of shared prompt "
                                               "prefixes (default: on where the model allows it: no KDA layers).")
    num_threads: int | None = _knob(None, "--threads", "torch threads (default: all cores, split among ranks).")
    gguf_path: str | None = None
    gemm: str = _knob("torch", "--gemm", "torch, blas or blas-gil-held (native BLAS via ctypes, see "
                      "native_gemm.py).")
    kernels: str = _knob("auto", "--kernels", "Native C++ kernels for attention and norms: auto (where they "
                         "build and apply), native (error if they cannot), torch (torch ops only).")
    decode_stack: str = _knob("auto", "--decode-stack", "auto: a decode-only step runs every layer in one native "
                              "call where the model allows it (attention layers, a dense MLP, the native kernels; "
                              "bit for bit the op-by-op path); off: op by op from Python, as prefill runs.")
    kv_transfer: bool = _knob(False, "--kv-transfer", "Send each prefill layer's K/V to a KV store on a "
                              "transfer thread.")
    kv_transfer_mode: str = _knob("layerwise", "--kv-transfer-mode", "layerwise (as each layer finishes) or "
                                  "after_prefill.")
    kv_transfer_impl: str = _knob("serialize", "--kv-transfer-impl", "serialize (per-block packing, holds the "
                                  "GIL) or bulk (native copies that release it).")
    kv_cache_dtype: str = _knob("auto", "--kv-cache-dtype", "KV storage of every attention layer: auto (the "
                                "model dtype), fp32, bf16, fp8 (e4m3) or int8; fp8/int8 keep a scale per block "
                                "and head.")
    kv_cache_dtypes: list[str] | None = _knob(None, "--kv-cache-dtypes", "One KV dtype per attention layer, "
                                              "comma-separated (overrides --kv-cache-dtype), e.g. int8,int8,bf16.")
    weight_format: str = _knob("auto", "--weight-format", "How the weights are held: auto (of fp32 and gguf, "
                               "whichever runs this model's linears faster on this machine, measured once and "
                               "kept), fp32 (the file's blocks dequantized at load), gguf (the file's Q4_1/Q8_0 "
                               "blocks as stored, computed with fp32 activations: the same model), gguf-a16 (those "
                               "blocks times activations held as two int8 digits per 32 elements: integer "
                               "products, within 1/32512 of each block's largest activation), gguf-a8 (one int8 "
                               "digit, as llama.cpp does: changes the numbers) or int8 (one scale per output row: "
                               "changes the numbers).")
    quantization: str | None = _knob(None, "--quantization", "w8a8 (int8 weights and activations) or "
                                     "int8-weight: the projections (not the LM head).")
    smoothquant_alpha: float | None = _knob(None, "--smoothquant-alpha", "w8a8: SmoothQuant migration strength "
                                            "(0-1, e.g. 0.5), calibrated on held-out text at start-up.")
    kda_decode_impl: str = _knob("vectorized", "--kda-decode-impl", "KDA decode step: vectorized or reference "
                                 "(loop).")
    kda_bv_tile: int | None = _knob(None, "--kda-bv-tile", "KDA decode: V tile width (default: the whole V).")
    kda_head_split: int = _knob(1, "--kda-head-split", "KDA decode: head groups.")
    tensor_parallel_size: int = _knob(1, "--tp", "Ranks sharing every layer by heads, features and vocab "
                                      "(processes over gloo).", "--tensor-parallel-size")
    expert_parallel_size: int = _knob(1, "--ep", "Ranks sharing each MoE layer's experts (model hybrid-moe; "
                                      "processes over gloo, the same ranks as --tp when both are set).",
                                      "--expert-parallel-size")
    moe_exchange: str = _knob("gloo", "--moe-exchange", "Expert parallelism's dispatch/combine: gloo "
                              "(torch.distributed), native (shared memory, GIL released) or native-gil-held.")
    tp_partial_precision: str = _knob("fp32", "--tp-partial-precision", "Row-parallel partial sums: fp32, "
                                      "reduced (bf16 operands) or 3-pass (bf16x3 split).")
    pipeline_parallel_size: int = _knob(1, "--pp", "Pipeline stages (processes holding runs of layers).",
                                        "--pipeline-parallel-size")
    pp_micro_batches: int = _knob(2, "--pp-micro-batches", "Pipeline: groups a step's sequences are split into, "
                                  "flowing through the stages.")
    speculative: str | None = _knob(None, "--speculative", "ngram (prompt lookup) or draft (the model's first "
                                    "--draft-layers layers): drafts verified greedily in one forward (greedy "
                                    "requests; outputs unchanged).")
    num_speculative_tokens: int = _knob(3, "--num-speculative-tokens", "Drafts per step (K).")
    prompt_lookup_max: int = _knob(4, "--prompt-lookup-max", "ngram: longest tail n-gram the drafter looks up.")
    prompt_lookup_min: int = _knob(2, "--prompt-lookup-min", "ngram: shortest tail n-gram the drafter looks up "
                                   "(a single repeated token is weak evidence).")
    draft_layers: int = _knob(2, "--draft-layers", "draft: the target's first layers (+ final norm and LM head) "
                              "that form the draft model.")
    draft_window: int = _knob(64, "--draft-window", "draft: tokens the draft model re-reads per draft token (it "
                              "keeps no cache).")
    rollback: str = _knob("snapshot", "--rollback", "KDA state after rejected drafts: snapshot (state per draft) "
                          "or replayssm (per-token inputs replayed from a checkpoint).")
    rollback_window: int | None = _knob(None, "--rollback-window", "Tokens one KDA rollback covers (the "
                                        "ReplaySSM ring; default: drafts + 1).")
    hybrid: HybridConfig = field(default_factory=HybridConfig)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ConfigError(f"model: unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        if self.model == "hybrid-moe":
            self.hybrid.check_moe()
        if self.dtype not in DTYPES:
            raise ConfigError(f"dtype: {self.dtype!r} is not supported; choose one of {', '.join(DTYPES)}")
        if self.gemm not in GEMMS:
            raise ConfigError(f"gemm: {self.gemm!r}; choose one of {', '.join(GEMMS)}")
        if self.gemm != "torch" and self.dtype != "float32":
            raise ConfigError(f"gemm: {self.gemm} runs fp32 only; use dtype float32 or gemm torch")
        if self.kernels not in KERNEL_CHOICES:
            raise ConfigError(f"kernels: {self.kernels!r}; choose one of {', '.join(KERNEL_CHOICES)}")
        if self.decode_stack not in DECODE_STACKS:
            raise ConfigError(f"decode_stack: {self.decode_stack!r}; choose one of {', '.join(DECODE_STACKS)}")
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ConfigError(f"tokenizer_mode: {self.tokenizer_mode!r}; choose one of {', '.join(TOKENIZER_MODES)}")
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
        self._check_weight_format()
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

    def _check_weight_format(self) -> None:
        if self.weight_format not in WEIGHT_FORMATS:
            raise ConfigError(f"weight_format: {self.weight_format!r}; choose one of {', '.join(WEIGHT_FORMATS)}")
        if self.weight_format in ("auto", "fp32"):  # auto falls back to fp32 where gguf does not apply
            return
        if self.weight_format in BLOCK_FORMATS and self.model != "llama":
            raise ConfigError(f"weight_format: {self.weight_format} reads the model file's blocks; the {self.model} "
                              "model has no file (random weights): use fp32 or int8")
        clash = [name for name, on in (("quantization", self.quantization is not None), ("gemm", self.gemm != "torch"),
                                       ("dtype", self.dtype != "float32"),
                                       ("tensor_parallel_size", self.tensor_parallel_size > 1),
                                       ("pipeline_parallel_size", self.pipeline_parallel_size > 1)) if on]
        if clash:
            raise ConfigError(f"weight_format: {self.weight_format} does not combine with {', '.join(clash)} "
                              f"(set to {', '.join(str(getattr(self, n)) for n in clash)}); use weight_format fp32 "
                              "or their defaults")

    def _check_kda_decode(self) -> None:
        if self.kda_decode_impl not in KDA_DECODE_IMPLS:
            raise ConfigError(f"kda_decode_impl: {self.kda_decode_impl!r}; choose one of {', '.join(KDA_DECODE_IMPLS)}")
        if self.kda_bv_tile is not None and (not isinstance(self.kda_bv_tile, int) or self.kda_bv_tile < 1):
            raise ConfigError(f"kda_bv_tile: must be a positive integer or None, got {self.kda_bv_tile!r}")
        heads = self.hybrid.kda_num_heads
        if not isinstance(self.kda_head_split, int) or self.kda_head_split < 1 or heads % self.kda_head_split:
            raise ConfigError(f"kda_head_split: {self.kda_head_split!r} must divide the {heads} KDA heads")

    def _check_transfer(self) -> None:
        for name, allowed in (("kv_transfer_mode", TRANSFER_MODES), ("kv_transfer_impl", TRANSFER_IMPLS)):
            if getattr(self, name) not in allowed:
                raise ConfigError(f"{name}: {getattr(self, name)!r}; choose one of {', '.join(allowed)}")

    def _check_parallel(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "pp_micro_batches", "expert_parallel_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be a positive integer, got {getattr(self, name)!r}")
        self._check_expert_parallel()
        if self.tensor_parallel_size > 1 and self.pipeline_parallel_size > 1:
            raise ConfigError("pipeline_parallel_size: does not combine with tensor_parallel_size > 1 yet; "
                              "choose one")
        if self.tp_partial_precision not in PARTIAL_PRECISIONS:
            raise ConfigError(f"tp_partial_precision: {self.tp_partial_precision!r}; choose one of "
                              f"{', '.join(PARTIAL_PRECISIONS)}")
        world = max(self.lockstep_ranks, self.pipeline_parallel_size)
        if world > 1:
            # kv_transfer needs rank 0 to hold every layer's whole KV: not so under tensor or pipeline parallelism
            split_kv = self.tensor_parallel_size > 1 or self.pipeline_parallel_size > 1
            clash = [name for name, on in (("speculative", self.speculative), ("quantization", self.quantization),
                                           ("kv_transfer", self.kv_transfer and split_kv),
                                           ("gemm", self.gemm != "torch"),
                                           ("kv_cache_dtypes", self.kv_cache_dtypes is not None
                                            and self.pipeline_parallel_size > 1))
                     if on]
            if clash:
                what = ("tensor" if self.tensor_parallel_size > 1 else
                        "expert" if self.expert_parallel_size > 1 else "pipeline")
                raise ConfigError(f"{what}_parallel_size: {world} does not combine with {', '.join(clash)} yet; "
                                  f"use one rank or turn them off")

    def _check_expert_parallel(self) -> None:
        ep, tp = self.expert_parallel_size, self.tensor_parallel_size
        if self.moe_exchange not in MOE_EXCHANGES:
            raise ConfigError(f"moe_exchange: {self.moe_exchange!r}; choose one of {', '.join(MOE_EXCHANGES)}")
        if ep == 1:
            return
        if self.model != "hybrid-moe":
            raise ConfigError(f"expert_parallel_size: {ep} needs model hybrid-moe (the {self.model} model has no "
                              "experts); use --model hybrid-moe or --ep 1")
        if self.hybrid.num_experts % ep:
            raise ConfigError(f"expert_parallel_size: {ep} does not divide hybrid.num_experts "
                              f"({self.hybrid.num_experts}); choose a divisor")
        if tp > 1 and tp != ep:
            raise ConfigError(f"expert_parallel_size: {ep} with tensor_parallel_size {tp}: both run on the same "
                              "ranks; make them equal or set one to 1")
        if self.pipeline_parallel_size > 1:
            raise ConfigError("expert_parallel_size: does not combine with pipeline_parallel_size > 1 yet; choose one")

    @property
    def lockstep_ranks(self) -> int:
        """Processes running every step together: tensor- and expert-parallel ranks (the same processes)."""
        return max(self.tensor_parallel_size, self.expert_parallel_size)

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

    def to_json(self) -> str:
        """Every field and its value as one line of JSON (hybrid as an object)."""
        return json.dumps(asdict(self))

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
        import torch

        return getattr(torch, self.dtype)

    def resolved_threads(self) -> int:
        """Threads torch should use."""
        ranks = self.lockstep_ranks * self.pipeline_parallel_size
        return self.num_threads or max(1, len(os.sched_getaffinity(0)) // ranks)
