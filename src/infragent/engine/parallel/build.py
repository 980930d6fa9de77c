"""Build one tensor-parallel rank's model shard and caches from an EngineConfig (rank 0 and the workers
take the same path, so their shards and cache layouts agree)."""
from __future__ import annotations

import torch

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


def build_shard(config, rank: int, world: int, num_blocks: int, block_size: int  # noqa: ANN001 (EngineConfig)
                ) -> tuple[DecoderModel, KVCache, KDAStateCache | None]:
    """A worker's shard and caches: num_blocks comes from rank 0, block tables are rank 0's."""
    from infragent.engine.gguf_weights import read_gguf
    from infragent.engine.models.hybrid import init_hybrid
    from infragent.engine.models.llama import load_llama
    from infragent.engine.tokenizer import Tokenizer

    gguf = read_gguf(config.gguf_path)
    if config.model == "llama":
        spec, weights = load_llama(gguf)
    else:
        spec, weights = init_hybrid(config.hybrid, Tokenizer.from_reader(gguf).vocab_size)
    model = shard_model(config, spec, weights, rank, world)
    local = model.spec
    kv_cache = KVCache(local.num_attention_layers, num_blocks, block_size, local.num_kv_heads, local.head_dim,
                       config.torch_dtype, config.kv_layout,
                       kv_formats(config.layer_kv_dtypes(local.num_attention_layers)))
    kda_states = (KDAStateCache(local.num_kda_layers, config.max_num_seqs, local.kda_num_heads,
                                local.kda_head_k_dim, local.kda_head_v_dim) if local.num_kda_layers else None)
    return model, kv_cache, kda_states
