"""Engine construction: the model (whole, a tensor-parallel shard or a pipeline stage) and its runner, the KV
cache sized from kv_cache_gb, the KDA state slots, the scheduler and the draft model; and quantization."""
from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from infragent.engine.block_manager import BlockManager
from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.gguf_weights import llama_config, read_gguf
from infragent.engine.kernels.build import use_block_kernels, use_native_kernels
from infragent.engine.kv_cache import KDAStateCache, KVCache, kv_formats
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.hybrid import hybrid_shape, init_hybrid
from infragent.engine.models.llama import llama_shape, load_llama
from infragent.engine.models.shape import ModelShape
from infragent.engine.native_gemm import make_gemm
from infragent.engine.options import BLOCK_FORMATS
from infragent.engine.parallel.build import caches, shard_model, stage_model
from infragent.engine.parallel.group import init_group
from infragent.engine.parallel.pp_runner import PPModelRunner, start_stages
from infragent.engine.parallel.tp_runner import TPModelRunner, start_workers
from infragent.engine.quant.apply import quantize_projections, store_int8
from infragent.engine.quant.blocks_a8 import DIGITS
from infragent.engine.quant.smoothquant import input_ranges, smoothing_factors
from infragent.engine.runner import ModelRunner
from infragent.engine.scheduler import Scheduler
from infragent.engine.speculative.draft_model import DraftModel
from infragent.engine.speculative.rollback import ReplayRollback, SnapshotRollback
from infragent.engine.state_slots import StateSlots
from infragent.engine.tokenizer import Tokenizer
from infragent.engine.weight_choice import WeightChoice, candidates, choose


log = logging.getLogger(__name__)


@dataclass
class EngineParts:
    """Everything the step loop runs on, built from one EngineConfig."""

    tokenizer: Tokenizer
    shape: ModelShape
    model: DecoderModel
    max_model_len: int
    kv_cache: KVCache
    kda_states: KDAStateCache | None
    blocks: BlockManager
    slots: StateSlots | None
    scheduler: Scheduler
    runner: ModelRunner
    draft_model: DraftModel | None
    weight_choice: WeightChoice


def build_parts(config: EngineConfig) -> EngineParts:
    """Load the model this process runs (rank 0 under tensor or pipeline parallelism, which starts the other
    ranks), size and allocate its caches, and make the scheduler, runner and draft model."""
    torch.set_num_threads(config.resolved_threads())
    gguf = read_gguf(config.gguf_path)  # header parsed once, shared by tokenizer and weights
    tokenizer = Tokenizer.from_reader(gguf, mode=config.tokenizer_mode)
    if config.model == "llama":
        shape, weights = load_llama(gguf, blocks=any(f in BLOCK_FORMATS for f in candidates(config)))
    else:
        shape, weights = init_hybrid(config.hybrid, tokenizer.vocab_size, config.model == "hybrid-moe")
    world, stages = config.lockstep_ranks, config.pipeline_parallel_size
    if world > 1:  # this process is rank 0: its shard, and the driver of the others
        model = shard_model(config, shape, weights, 0, world)
    elif stages > 1:  # rank 0 is the first pipeline stage
        model = stage_model(config, shape, weights, 0, stages)
    else:
        model = DecoderModel(shape, weights, config.torch_dtype, consume=True)
        if config.weight_format == "int8":
            store_int8(model)
        model.use_gemm(make_gemm(config.gemm))
        model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
    del weights
    max_model_len = config.max_model_len or min(shape.max_position_embeddings, 4096)
    if max_model_len > shape.max_position_embeddings:
        raise ConfigError(f"max_model_len: {max_model_len} exceeds the model's context "
                          f"({shape.max_position_embeddings}); lower it")
    local = model.shape  # a shard's head counts under tensor parallelism
    formats, block_size, num_blocks = size_kv_cache(config, local, max_model_len)
    blocks = BlockManager(num_blocks, block_size, _prefix_caching(config, shape))
    slots = StateSlots(config.max_num_seqs) if shape.num_kda_layers else None
    if stages > 1:  # the blocks and slots of one process; each stage stores only its own layers' share
        kv_cache, kda_states = caches(config, model, num_blocks, block_size)
    else:
        kv_cache = KVCache(local.num_attention_layers, num_blocks, block_size, local.num_kv_heads,
                           local.head_dim, config.torch_dtype, config.kv_layout, formats)
        kv_cache.kernels = model.kernels = use_native_kernels(config.kernels, config.torch_dtype, local.kernel_sizes())
        model.use_decode_stack = config.decode_stack == "auto"
        model.use_block_kernels(candidates(config) != ("fp32",) and use_block_kernels(config.kernels))
        if config.weight_format in DIGITS:
            model.use_int8_activations(DIGITS[config.weight_format])
        kda_states = (KDAStateCache(local.num_kda_layers, config.max_num_seqs, local.kda_num_heads,
                                    local.kda_head_k_dim, local.kda_head_v_dim) if slots else None)
    weight_choice = _weight_choice(config, gguf.path, model)
    if world == 1 and stages == 1 and config.gemm == "torch" and use_block_kernels(config.kernels):
        measured = model.use_dense_kernel(config.resolved_threads())  # the qgemm library's dense product
        log.info("dense products (native/BLAS speedup by rows): %s", "; ".join(measured))
    scheduler = Scheduler(config.max_num_seqs, config.max_num_batched_tokens, blocks, slots)
    runner = _make_runner(config, model, kv_cache, kda_states, slots, num_blocks, block_size)
    draft_model = None
    if config.speculative == "draft":
        if config.draft_layers >= shape.num_layers:
            raise ConfigError(f"draft_layers: {config.draft_layers} is not fewer than the model's "
                              f"{shape.num_layers} layers; a draft model must be smaller")
        draft_model = DraftModel(model, config.draft_layers, config.draft_window, config.num_speculative_tokens)
    if config.speculative is not None and kda_states is not None:
        rollback = ReplayRollback if config.rollback == "replayssm" else SnapshotRollback
        kda_states.rollback = rollback(kda_states.states, config.resolved_rollback_window())
    return EngineParts(tokenizer, shape, model, max_model_len, kv_cache, kda_states, blocks, slots, scheduler,
                       runner, draft_model, weight_choice)


def _weight_choice(config: EngineConfig, model_file: Path, model: DecoderModel) -> WeightChoice:
    """Resolve weight_format (auto: measured, see weight_choice.py); a model loaded as blocks that is to run
    fp32 is dequantized in place, to what weight_format fp32 would have loaded."""
    if len(candidates(config)) == 1:
        return choose(config, model_file, [], False, 0)
    linears = model.linears()
    per_layer = len(model.projections()) // max(model.shape.num_layers, 1)
    choice = choose(config, model_file, linears[:per_layer] + linears[-1:], model.block_kernels,
                    model.shape.num_layers)
    if choice.format == "fp32":
        model.hold_fp32()
    else:
        model.use_blas_from(choice.blas_from)
    log.info("weight_format %s: %s", choice.format, choice.reason)
    return choice


def _prefix_caching(config: EngineConfig, shape: ModelShape) -> bool:
    """enable_prefix_caching resolved: on by default for a paged cache without KDA layers."""
    if config.enable_prefix_caching is None:
        return shape.num_kda_layers == 0 and config.kv_layout == "paged"
    if config.enable_prefix_caching and (shape.num_kda_layers or config.kv_layout != "paged"):
        raise ConfigError("enable_prefix_caching: needs the paged layout and a model without KDA layers "
                          "(KDA state is not cached per block); turn it off")
    return config.enable_prefix_caching


def _make_runner(config: EngineConfig, model: DecoderModel, kv_cache: KVCache, kda_states: KDAStateCache | None,
                 slots: StateSlots | None, num_blocks: int, block_size: int) -> ModelRunner:
    """The runner: in-process, or driving tensor/expert-parallel workers or pipeline stages it starts now."""
    world, stages = config.lockstep_ranks, config.pipeline_parallel_size
    if world > 1:
        workers, port = start_workers(config, world, num_blocks, block_size)
        init_group(0, world, port)
        return TPModelRunner(model, kv_cache, kda_states, slots, block_size, workers=workers)
    if stages > 1:
        workers, port = start_stages(config, stages, num_blocks, block_size)
        init_group(0, stages, port)
        return PPModelRunner(model, kv_cache, kda_states, slots, block_size, workers=workers, stages=stages,
                             micro_batches=config.pp_micro_batches, vocab=model.shape.vocab_size)
    return ModelRunner(model, kv_cache, kda_states, slots, block_size, speculative=config.speculative is not None)


def size_kv_cache(config: EngineConfig, shape: ModelShape, max_model_len: int) -> tuple[list, int, int]:
    """Size the attention KV cache from kv_cache_gb; returns (layer formats, block_size, num_blocks)."""
    formats = kv_formats(config.layer_kv_dtypes(shape.num_attention_layers))
    block_size = config.block_size if config.kv_layout == "paged" else max_model_len
    capacity = int(config.kv_cache_gb * 1e9 // max(_kv_bytes_per_token(config, shape, block_size), 1))
    num_blocks = capacity // block_size
    if num_blocks * block_size < max_model_len or num_blocks == 0:
        raise ConfigError(f"kv_cache_gb: {config.kv_cache_gb} GB holds {capacity} tokens, fewer than "
                          f"max_model_len={max_model_len}; raise kv_cache_gb or lower max_model_len")
    return formats, block_size, num_blocks


def kv_cache_gb_for(config: EngineConfig, tokens: int) -> float:
    """The kv_cache_gb that holds `tokens` tokens (rounded up to whole blocks) of this config's model."""
    shape = model_shape(config)
    block_size = config.block_size if config.kv_layout == "paged" else (config.max_model_len or tokens)
    blocks = -(-tokens // block_size)
    per_token = _kv_bytes_per_token(config, shape, block_size)
    return max(blocks * block_size * per_token / 1e9 * 1.001, 1e-3)  # 1.001: past float rounding


def model_shape(config: EngineConfig) -> ModelShape:
    """The shape of the config's model, read from the GGUF's header (no weights are loaded)."""
    gguf = read_gguf(config.gguf_path)
    if config.model == "llama":
        return llama_shape(llama_config(gguf))
    return hybrid_shape(config.hybrid, Tokenizer.from_reader(gguf).vocab_size, config.model == "hybrid-moe")


def _kv_bytes_per_token(config: EngineConfig, shape: ModelShape, block_size: int) -> float:
    """K and V rows in each attention layer's format, plus (scaled formats) a K and V scale per head and block."""
    formats = kv_formats(config.layer_kv_dtypes(shape.num_attention_layers))
    model_element = torch.finfo(config.torch_dtype).bits // 8
    row = shape.num_kv_heads * shape.head_dim
    return sum(2 * row * (f.element_size if f else model_element)
               + (2 * shape.num_kv_heads * 4 / block_size if f and f.scaled else 0) for f in formats)


def quantize(model: DecoderModel, config: EngineConfig, calibrate: Callable[[], None]) -> None:
    """Quantize the model's projections; with smoothquant_alpha, first record activation ranges while
    calibrate() runs held-out text through the model."""
    smooth = None
    if config.smoothquant_alpha is not None:
        ranges = input_ranges(model, calibrate)
        smooth = [smoothing_factors(amax, getattr(owner, name).weight_t, config.smoothquant_alpha)
                  for amax, (owner, name) in zip(ranges, model.projections())]
    quantize_projections(model, config.quantization, smooth)


def give_back_freed_memory() -> None:
    """Return the heap's free pages to the system (glibc's malloc_trim): dequantizing and transposing the
    weights leaves about 0.4 GB freed but resident after an engine is built. A no-op without glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
