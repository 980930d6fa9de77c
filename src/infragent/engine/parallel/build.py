"""Build one tensor-parallel rank's model shard and caches from an EngineConfig (rank 0 and the workers
take the same path, so their shards and cache layouts agree)."""
from __future__ import annotations

import torch

from infragent.engine.kernels.build import use_native_kernels
from infragent.engine.kv_cache import KDAStateCache, KVCache, kv_formats
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.models.spec import ModelSpec
from infragent.engine.parallel.shard import shard_weights
from infragent.engine.parallel.tp_runner import make_tensor_parallel


def shard_model(config, spec: ModelSpec, weights: dict[str, torch.Tensor], rank: int,  # noqa: ANN001
                world: int) -> DecoderModel:
    """Rank's DecoderModel over its weight slices, with row-parallel and vocab-parallel layers."""
    local_spec, local = shard_weights(spec, weights, rank, world)
    model = DecoderModel(local_spec, local, config.torch_dtype)
    make_tensor_parallel(model, rank, world, spec.vocab_size, config.tp_partial_precision)
    model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
    return model


def load_weights(config) -> tuple[ModelSpec, dict[str, torch.Tensor]]:  # noqa: ANN001 (EngineConfig)
    """The full model's spec and weights, as LLMEngine loads them."""
    from infragent.engine.gguf_weights import read_gguf
    from infragent.engine.models.hybrid import init_hybrid
    from infragent.engine.models.llama import load_llama
    from infragent.engine.tokenizer import Tokenizer

    gguf = read_gguf(config.gguf_path)
    if config.model == "llama":
        return load_llama(gguf)
    return init_hybrid(config.hybrid, Tokenizer.from_reader(gguf).vocab_size)


def stage_model(config, spec: ModelSpec, weights: dict[str, torch.Tensor], stage: int,  # noqa: ANN001
                stages: int) -> DecoderModel:
    """Stage's DecoderModel: its run of layers only (caches renumbered from 0)."""
    from infragent.engine.parallel.shard import bounds

    model = DecoderModel(spec, weights, config.torch_dtype)
    model.use_kda_decode(config.kda_decode_impl, config.kda_bv_tile, config.kda_head_split)
    model.keep_layers(*bounds(spec.num_layers, stages, stage))
    return model


def build_stage(config, stage: int, stages: int, num_blocks: int, block_size: int  # noqa: ANN001
                ) -> tuple[DecoderModel, KVCache, KDAStateCache | None, int]:
    """A stage process's layers and caches, and the vocabulary size."""
    spec, weights = load_weights(config)
    model = stage_model(config, spec, weights, stage, stages)
    kv_cache, kda_states = caches(config, model, num_blocks, block_size)
    return model, kv_cache, kda_states, spec.vocab_size


def caches(config, model: DecoderModel, num_blocks: int, block_size: int  # noqa: ANN001
           ) -> tuple[KVCache, KDAStateCache | None]:
    """KV cache and KDA states for the layers model holds (num_blocks and block tables are rank 0's)."""
    spec = model.spec
    attention = sum(1 for _, mixer, _, _ in model.layers if hasattr(mixer, "qkv"))
    kda = len(model.layers) - attention
    kv_cache = KVCache(attention, num_blocks, block_size, spec.num_kv_heads, spec.head_dim, config.torch_dtype,
                       config.kv_layout, kv_formats(config.layer_kv_dtypes(attention)))
    kv_cache.kernels = model.kernels = use_native_kernels(config.kernels, config.torch_dtype, spec.kernel_sizes())
    kda_states = (KDAStateCache(kda, config.max_num_seqs, spec.kda_num_heads, spec.kda_head_k_dim,
                                spec.kda_head_v_dim) if kda else None)
    return kv_cache, kda_states


def build_shard(config, rank: int, world: int, num_blocks: int, block_size: int  # noqa: ANN001 (EngineConfig)
                ) -> tuple[DecoderModel, KVCache, KDAStateCache | None]:
    """A worker's shard and caches: num_blocks comes from rank 0, block tables are rank 0's."""
    spec, weights = load_weights(config)
    model = shard_model(config, spec, weights, rank, world)
    return (model, *caches(config, model, num_blocks, block_size))
