"""Tensor parallelism: weight shards per rank, row-parallel reductions, a vocab-parallel LM head, workers."""
