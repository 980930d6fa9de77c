"""Build one tensor-parallel rank's model shard and caches from an EngineConfig (rank 0 and the workers
take the same path, so their shards and cache layouts agree)."""
from __future__ import annotations

import torch

from infragent.engine.kernels.build import use_native_kernels
from infragent.engine.kv_cache import KDAStateCache, KVCache, kv_formats
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.layers import GatedMLP
from infragent.engine.models.shape import ModelShape
from infragent.engine.parallel.expert import drop_foreign_experts, make_expert_parallel
from infragent.engine.parallel.layers import RowParallel, VocabParallelHead
from infragent.engine.parallel.shard import bounds, shard_weights


def shard_model(config, shape: ModelShape, weights: dict[str, torch.Tensor], rank: int,  # noqa: ANN001
                world: int) -> DecoderModel:
    """Rank's DecoderModel over its weight slices: row-parallel and vocab-parallel layers under tensor
    parallelism, its share of the experts behind an exchange under expert parallelism."""
    local_shape, local = shape, weights
    if config.expert_parallel_size > 1:
        local_shape = drop_foreign_experts(shape, weights, rank, world)
    if config.tensor_parallel_size > 1:
        local_shape, local = shard_weights(local_shape, weights, rank, world)
    model = DecoderModel(local_shape, local, config.torch_dtype, consume=True)
    if config.tensor_parallel_size > 1:
        make_tensor_parallel(model, rank, world, shape.vocab_size, config.tp_partial_precision)
    if config.expert_parallel_size > 1:
        make_expert_parallel(model, rank, world, config.moe_exchange, config.max_num_batched_tokens)
    model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
    return model


def make_tensor_parallel(model: DecoderModel, rank: int, world: int, vocab_size: int, precision: str) -> None:
    """Wrap a rank's shard: row-parallel o/down/o_proj, vocab-parallel LM head. MoE layers are whole on every
    rank (shard.py does not split experts), so they need no reduction."""
    for _, mixer, _, mlp in model.layers:
        name = "o" if hasattr(mixer, "qkv") else "o_proj"
        setattr(mixer, name, RowParallel(getattr(mixer, name), precision))
        if isinstance(mlp, GatedMLP):
            mlp.down = RowParallel(mlp.down, precision)
    model.lm_head = VocabParallelHead(model.lm_head, bounds(vocab_size, world, rank)[0], vocab_size)


def load_weights(config) -> tuple[ModelShape, dict[str, torch.Tensor]]:  # noqa: ANN001 (EngineConfig)
    """The full model's shape and weights, as LLMEngine loads them."""
    from infragent.engine.gguf_weights import read_gguf
    from infragent.engine.models.hybrid import init_hybrid
    from infragent.engine.models.llama import load_llama
    from infragent.engine.tokenizer import Tokenizer

    gguf = read_gguf(config.gguf_path)
    if config.model == "llama":
        return load_llama(gguf)
    return init_hybrid(config.hybrid, Tokenizer.from_reader(gguf).vocab_size, config.model == "hybrid-moe")


def stage_model(config, shape: ModelShape, weights: dict[str, torch.Tensor], stage: int,  # noqa: ANN001
                stages: int) -> DecoderModel:
    """Stage's DecoderModel: its run of layers only (caches renumbered from 0); it consumes weights."""
    model = DecoderModel(shape, weights, config.torch_dtype, consume=True)
    model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
    model.keep_layers(*bounds(shape.num_layers, stages, stage))
    return model


def build_stage(config, stage: int, stages: int, num_blocks: int, block_size: int  # noqa: ANN001
                ) -> tuple[DecoderModel, KVCache, KDAStateCache | None, int]:
    """A stage process's layers and caches, and the vocabulary size."""
    shape, weights = load_weights(config)
    model = stage_model(config, shape, weights, stage, stages)
    kv_cache, kda_states = caches(config, model, num_blocks, block_size)
    return model, kv_cache, kda_states, shape.vocab_size


def caches(config, model: DecoderModel, num_blocks: int, block_size: int  # noqa: ANN001
           ) -> tuple[KVCache, KDAStateCache | None]:
    """KV cache and KDA states for the layers model holds (num_blocks and block tables are rank 0's)."""
    shape = model.shape
    attention = sum(1 for _, mixer, _, _ in model.layers if hasattr(mixer, "qkv"))
    kda = len(model.layers) - attention
    kv_cache = KVCache(attention, num_blocks, block_size, shape.num_kv_heads, shape.head_dim, config.torch_dtype,
                       config.kv_layout, kv_formats(config.layer_kv_dtypes(attention)))
    kv_cache.kernels = model.kernels = use_native_kernels(config.kernels, config.torch_dtype, shape.kernel_sizes())
    model.use_decode_stack = config.decode_stack == "auto"
    kda_states = (KDAStateCache(kda, config.max_num_seqs, shape.kda_num_heads, shape.kda_head_k_dim,
                                shape.kda_head_v_dim) if kda else None)
    return kv_cache, kda_states


def build_shard(config, rank: int, world: int, num_blocks: int, block_size: int  # noqa: ANN001 (EngineConfig)
                ) -> tuple[DecoderModel, KVCache, KDAStateCache | None]:
    """A worker's shard and caches: num_blocks comes from rank 0, block tables are rank 0's."""
    shape, weights = load_weights(config)
    model = shard_model(config, shape, weights, rank, world)
    return (model, *caches(config, model, num_blocks, block_size))
