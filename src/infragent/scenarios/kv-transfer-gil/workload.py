"""kv-transfer-gil workload: one SmolLM2 prefill whose K/V goes, layer by layer, to a KV store on a transfer thread.

Disaggregated serving hands each prefill layer's K/V to a "kv-transfer" thread so the transfer overlaps the next
layers' compute; a prefill is done only when its KV has landed in the store. The projections run through a native
BLAS call: when that call holds the GIL (release_gil=False, the bug) the Python-side transfer starves and the
prefill pays for it; releasing the GIL (the fix) lets the transfer run on the second core during compute.

Loaded by file path (the pack folder is not a package). Engines are built once per configuration, warmed until
their KV blocks (and so the store's keys) have all been used once, and cached; every call runs one full prefill
(prefix caching off: benchmarks repeat the same prompt) on one torch thread and leaves its engine empty.
"""
from __future__ import annotations

import math

import torch

from infragent.engine.config import EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.sampling import SamplingParams
from infragent.probes.inputs import Case

PROMPT_TOKENS = 256  # one prefill of ~0.6 s on one core: long enough to dwarf per-call overhead
TOKEN_RANGE = (1000, 40000)  # ordinary ids of SmolLM2's 49,152-token vocabulary
MAX_MODEL_LEN = 512
KV_CACHE_GB = 0.05  # 67 blocks of 16 tokens: the warm-up cycles through all of them (see _warm)
ENGINE_THREADS = 1  # the second core is the transfer thread's

_KNOBS = {"none": dict(gemm="blas", kv_transfer=False),  # the reference: same native GEMM, no transfer
          "held": dict(gemm="blas-gil-held", kv_transfer=True),  # the bug: GEMM via ctypes.PyDLL holds the GIL
          "released": dict(gemm="blas", kv_transfer=True)}  # the fix: the same call via ctypes.CDLL
_ENGINES: dict[str, LLMEngine] = {}
_PARAMS = SamplingParams(max_tokens=1, ignore_eos=True)  # prefill only: the first token comes from its logits


def inputs(trial: int, gen: torch.Generator) -> Case:
    """One prompt: PROMPT_TOKENS token ids drawn from gen (a LongTensor, so probes can refill it in place)."""
    low, high = TOKEN_RANGE
    prompt = torch.randint(low, high, (PROMPT_TOKENS,), generator=gen, dtype=torch.long)
    return Case(args=(prompt,), label=f"{PROMPT_TOKENS}-token prompt #{trial}")


def prefill(prompt: torch.Tensor | list[int], release_gil: bool = False) -> torch.Tensor:
    """One prefill WITH KV transfer; projections through native BLAS holding (False) or releasing (True) the GIL.

    Returns the last position's next-token logits [vocab] (fp32), after the step has waited for the KV
    of every layer to land in the store.
    """
    return _run(_engine("released" if release_gil else "held"), prompt)


def prefill_without_transfer(prompt: torch.Tensor | list[int]) -> torch.Tensor:
    """The same prefill without KV transfer: the reference output and the "no transfer" baseline."""
    return _run(_engine("none"), prompt)


def workload(release_gil: bool = False, prefills: int = 3) -> None:
    """A few prefills with KV transfer in a row, for traces and GIL probes (fixed prompts, seeds 0..prefills-1)."""
    for trial in range(prefills):
        (prompt,) = inputs(trial, torch.Generator().manual_seed(trial)).args
        prefill(prompt, release_gil=release_gil)


def engine(kind: str) -> LLMEngine:
    """The cached engine of one configuration: 'none', 'held' or 'released' (built and warmed on first use)."""
    return _engine(kind)


def close() -> None:
    """Stop the cached engines' transfer threads and drop the engines (the next call rebuilds them)."""
    for built in _ENGINES.values():
        if built.kv_transfer is not None:
            built.kv_transfer.close()
    _ENGINES.clear()


def _engine(kind: str) -> LLMEngine:
    built = _ENGINES.get(kind)
    if built is None:
        with _one_thread():
            built = LLMEngine(EngineConfig(model="llama", num_threads=ENGINE_THREADS, kv_cache_gb=KV_CACHE_GB,
                                           max_model_len=MAX_MODEL_LEN, enable_prefix_caching=False,
                                           **_KNOBS[kind]))
        _capture_logits(built)
        _warm(built)
        _ENGINES[kind] = built
    return built


def _capture_logits(built: LLMEngine) -> None:
    """Keep the logits the runner computes before sampling (the engine returns only token ids)."""
    model = built.model
    compute = model.logits

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        out = compute(hidden)
        model.last_logits = out
        return out

    model.logits = logits
    model.last_logits = None


def _warm(built: LLMEngine) -> None:
    """Prefill until every KV block has been used once: the store has then seen all its keys and the allocator
    its peak, so no first-touch page faults land in measurements (the free list hands blocks out round-robin)."""
    blocks_per_prompt = math.ceil(PROMPT_TOKENS / built.blocks.block_size)
    rounds = math.ceil(built.blocks.num_blocks / blocks_per_prompt) + 1
    generator = torch.Generator().manual_seed(12345)
    for trial in range(rounds):
        (prompt,) = inputs(trial, generator).args
        _run(built, prompt)


def _run(built: LLMEngine, prompt: torch.Tensor | list[int]) -> torch.Tensor:
    token_ids = prompt.tolist() if isinstance(prompt, torch.Tensor) else list(prompt)
    if built.has_unfinished():
        raise RuntimeError("kv-transfer-gil workload: engine has unfinished requests before a prefill")
    with _one_thread():
        built.model.last_logits = None
        seq = built.add_request(token_ids, _PARAMS)
        while built.has_unfinished():
            built.step()
        logits = built.model.last_logits
    if seq.finish_reason is None or logits is None or logits.shape[0] != 1:
        raise RuntimeError(f"kv-transfer-gil workload: prefill did not finish with one sampled row "
                           f"(finish_reason={seq.finish_reason})")
    blocks = built.blocks
    if blocks.num_free_blocks != blocks.num_blocks:
        raise RuntimeError(f"kv-transfer-gil workload: {blocks.num_blocks - blocks.num_free_blocks} KV blocks "
                           "still held after the prefill finished")
    built.model.last_logits = None
    return logits[0].clone()


class _one_thread:
    """torch on ENGINE_THREADS threads inside a call (bench harnesses set their own count), restored after."""

    def __enter__(self) -> None:
        self.previous = torch.get_num_threads()
        if self.previous != ENGINE_THREADS:
            torch.set_num_threads(ENGINE_THREADS)

    def __exit__(self, *exc: object) -> None:
        if torch.get_num_threads() != self.previous:
            torch.set_num_threads(self.previous)

