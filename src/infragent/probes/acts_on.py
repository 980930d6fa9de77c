"""What a serving knob acts on, in any stack: the words `diagnose` names a bottleneck's remedies with and a
spec's knob declares (`acts_on`), so a diagnosis reaches the knobs that can move it on vLLM, SGLang, llama.cpp
or ours alike."""
from __future__ import annotations

ACTS_ON = {
    "batch_limit": "how many requests run at once (max_num_seqs, max-running-requests, parallel slots)",
    "kv_capacity": "KV-cache memory (kv_cache_gb, gpu-memory-utilization, context per slot)",
    "prefill_chunk": "tokens per step and prefill scheduling (max_num_batched_tokens, chunked prefill, batch size)",
    "threads": "threads per process and processes (threads, OMP/BLAS pools, workers)",
    "tokenizer": "where and how text becomes tokens (tokenizer mode, tokenizer workers)",
}
