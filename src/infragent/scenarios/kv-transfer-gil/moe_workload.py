"""kv-transfer-gil, the MoE setting (case study 2 as it happened): a prefill of the hybrid-MoE model on two
expert-parallel ranks, its K/V sent layer by layer to a KV store on a transfer thread.

Every MoE layer's dispatch and combine run through the native shared-memory exchange
(engine/parallel/native_exchange.py). Called through ctypes.PyDLL it holds the GIL while it copies and waits
for the other rank (release_gil=False, the bug, as DeepEP before PR #142), so rank 0's transfer thread cannot
run in those intervals; through ctypes.CDLL it releases it (the fix).

One engine serves every mode, because a process can join only one expert-parallel group: the modes differ in
rank 0's loader for the exchange (set_exchange_gil) and in whether the KV store is attached for the call
(the reference, "without transfer"). The engine is built and warmed on first use and cached; each call runs
one prefill on one torch thread per rank and leaves the engine empty. Loaded by file path.
"""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from types import ModuleType

import torch

from infragent.engine.config import EngineConfig, HybridConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.parallel.expert import set_exchange_gil
from infragent.probes.inputs import Case

PROMPT_TOKENS = 1024
TOKEN_RANGE = (1000, 40000)
# The device analogy on a CPU: in a GPU prefill the host thread spends its MoE layers inside dispatch/combine
# waiting for the device, and the KV transfer is a real share of the (fast) prefill. Here rank 0's own compute
# is small (narrow hidden size), its experts are cold (router_skew sends every token's top-2 to rank 1's
# experts), so rank 0 waits in the exchange while rank 1 computes; the KV is wide (8 KV heads of 128) so the
# transfer's Python work is ~5% of the prefill. Hybrid layout: KDA and attention 1:1, MoE after layer 0.
MODEL = HybridConfig(hidden_size=64, intermediate_size=128, num_layers=4, kda_per_attention=1, num_heads=8,
                     num_kv_heads=8, head_dim=128, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=32,
                     num_experts=8, num_experts_per_tok=2, moe_intermediate_size=1024,
                     shared_expert_intermediate_size=64, router_skew=1.0)
KV_CACHE_GB = 0.1
BLOCK_SIZE = 16  # tokens per KV block: the serialize client packs and sends one block at a time
_ENGINE: list[LLMEngine] = []


def _sibling(name: str) -> ModuleType:
    """A module of this pack folder (not a package: loaded by path, as the loop loads this one)."""
    spec = importlib.util.spec_from_file_location(f"kv_transfer_gil_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_DENSE = _sibling("workload")  # the GEMM case's prefill loop, one-thread guard and checks are shared


def inputs(trial: int, gen: torch.Generator) -> Case:
    """One prompt: PROMPT_TOKENS token ids drawn from gen."""
    low, high = TOKEN_RANGE
    prompt = torch.randint(low, high, (PROMPT_TOKENS,), generator=gen, dtype=torch.long)
    return Case(args=(prompt,), label=f"{PROMPT_TOKENS}-token prompt #{trial}")


def prefill(prompt: torch.Tensor | list[int], release_gil: bool = False) -> torch.Tensor:
    """One EP=2 prefill WITH layer-wise KV transfer; dispatch/combine hold (False) or release (True) the GIL.
    Returns the last position's logits [vocab] after every layer's KV has landed in the store."""
    return _run(prompt, transfer=True, release_gil=release_gil)


def prefill_without_transfer(prompt: torch.Tensor | list[int]) -> torch.Tensor:
    """The same prefill with no KV transfer (the exchange releasing the GIL): reference output and baseline."""
    return _run(prompt, transfer=False, release_gil=True)


def workload(release_gil: bool = False, prefills: int = 3) -> None:
    """A few prefills with KV transfer in a row, for traces and GIL probes (fixed prompts)."""
    for trial in range(prefills):
        (prompt,) = inputs(trial, torch.Generator().manual_seed(trial)).args
        prefill(prompt, release_gil=release_gil)


def engine() -> LLMEngine:
    """The cached EP=2 engine (built, with its second rank, and warmed on first use)."""
    if not _ENGINE:
        with _DENSE._one_thread():
            built = LLMEngine(EngineConfig(model="hybrid-moe", hybrid=MODEL, expert_parallel_size=2,
                                           moe_exchange="native", kv_transfer=True, num_threads=1,
                                           kv_cache_gb=KV_CACHE_GB, max_model_len=2048, enable_prefix_caching=False,
                                           block_size=BLOCK_SIZE))
        _capture_logits(built)
        _ENGINE.append(built)
        _warm(built)
    return _ENGINE[0]


def close() -> None:
    """Stop the engine's second rank and transfer thread (the next call builds a new engine)."""
    if _ENGINE:
        _ENGINE.pop().close()


def _capture_logits(built: LLMEngine) -> None:
    """Keep the logits rank 0 computes for the sampled row (the engine returns only token ids)."""
    head = built.model.lm_head

    class Capture:
        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            out = head(x)
            built.model.last_logits = out
            return out

        def __getattr__(self, name: str) -> object:
            return getattr(head, name)

    built.model.lm_head = Capture()
    built.model.last_logits = None


def _warm(built: LLMEngine) -> None:
    """Prefill until every KV block has been used once (no first-touch page faults in measurements), both
    loaders of the exchange included."""
    blocks_per_prompt = math.ceil(PROMPT_TOKENS / built.blocks.block_size)
    rounds = math.ceil(built.blocks.num_blocks / blocks_per_prompt) + 1
    generator = torch.Generator().manual_seed(12345)
    for trial in range(rounds):
        (prompt,) = inputs(trial, generator).args
        _run(prompt, transfer=trial % 2 == 0, release_gil=trial % 3 == 0)


def _run(prompt: torch.Tensor | list[int], transfer: bool, release_gil: bool) -> torch.Tensor:
    """One prefill on the cached engine in one mode (workload.py's prefill loop and checks)."""
    built = engine()
    set_exchange_gil(built.model, release_gil)
    kv_transfer, saved = built.kv_transfer, built.kv_cache.transfer
    if not transfer:  # detach the store for this call
        built.kv_transfer = built.kv_cache.transfer = None
    try:
        return _DENSE._run(built, prompt).float()
    finally:
        built.kv_transfer, built.kv_cache.transfer = kv_transfer, saved
