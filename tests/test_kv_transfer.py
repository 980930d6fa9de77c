"""KV transfer to a store on its own thread, native GEMM holding or releasing the GIL, and the timeline
signature of the brief's second case study: with the GIL held in compute, the transfer never runs during it."""
from __future__ import annotations

import random

import pytest
import torch

from infragent.analysis.overlap import never_overlapping, overlap
from infragent.analysis.trace_load import columns_from_trace
from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.native_gemm import NativeGemm
from infragent.engine.sampling import SamplingParams
from infragent.probes.analyze import analyze
from infragent.trace import Recorder
from server_fixture import tiny_config


@pytest.mark.parametrize("release_gil", [True, False])
def test_native_gemm_matches_torch(release_gil):
    x, w = torch.randn(37, 64), torch.randn(64, 96)
    torch.testing.assert_close(NativeGemm(release_gil)(x, w), x @ w, rtol=1e-5, atol=1e-5)


def test_gemm_knob_is_validated_and_keeps_greedy_outputs():
    with pytest.raises(ConfigError, match="gemm: 'cublas'"):
        EngineConfig(gemm="cublas")
    with pytest.raises(ConfigError, match="fp32 only"):
        EngineConfig(gemm="blas", dtype="bfloat16")
    prompts = [[5, 9, 200, 31, 7, 1000, 42], [77, 3, 12]]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outputs = {}
    for gemm in ("torch", "blas", "blas-gil-held"):
        engine = LLMEngine(tiny_config(gemm=gemm))
        seqs = [engine.add_request(p, params) for p in prompts]
        while engine.has_unfinished():
            engine.step()
        outputs[gemm] = [s.output_token_ids for s in seqs]
    assert outputs["blas"] == outputs["torch"] == outputs["blas-gil-held"]


@pytest.mark.parametrize("mode, impl", [("layerwise", "serialize"), ("layerwise", "bulk"),
                                        ("after_prefill", "serialize"), ("after_prefill", "bulk")])
def test_transfer_puts_every_prefill_row_in_the_store(mode, impl):
    engine = LLMEngine(tiny_config(kv_transfer=True, kv_transfer_mode=mode, kv_transfer_impl=impl))
    seq = engine.add_request(list(range(100, 140)), SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    store, cache = engine.kv_store, engine.kv_cache
    stored = 0
    for layer, block, first in store.keys():
        k, v = store.get((layer, block, first))
        rows = k.shape[0]
        expect_k = cache.k[layer][block, :, first:first + rows].transpose(0, 1).reshape(rows, -1)
        torch.testing.assert_close(k, expect_k, rtol=0, atol=0)
        torch.testing.assert_close(v, cache.v[layer][block, :, first:first + rows].transpose(0, 1).reshape(rows, -1),
                                   rtol=0, atol=0)
        stored += rows
    assert stored == 40 * engine.shape.num_attention_layers  # the prompt's rows, not the decode step's
    assert len(seq.output_token_ids) == 2
    engine.kv_transfer.close()
    with pytest.raises(ConfigError, match="kv_transfer_impl: 'rdma'"):
        EngineConfig(kv_transfer_impl="rdma")


def _traced_prefill(gemm: str):
    engine = LLMEngine(EngineConfig(model="llama", num_threads=1, gemm=gemm, kv_transfer=True, kv_cache_gb=0.2,
                                    max_model_len=1024))
    rng = random.Random(0)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    engine.add_request([rng.randrange(1000, 40000) for _ in range(64)], params)  # warm up
    while engine.has_unfinished():
        engine.step()
    with Recorder(thread_cpu=True) as rec:
        engine.add_request([rng.randrange(1000, 40000) for _ in range(400)], params)
        while engine.has_unfinished():
            engine.step()
    engine.kv_transfer.close()
    return columns_from_trace(rec.trace())


def test_timeline_shows_the_transfer_never_running_while_compute_holds_the_gil():
    held = _traced_prefill("blas-gil-held")
    o = overlap(held, "kv.transfer", "gemm")
    assert o.never and o.a_threads[0].startswith("kv-transfer") and o.b_threads[0].startswith("MainThread")
    pairs = [(p.a, p.b) for p in never_overlapping(held)]
    assert any("kv.transfer @ kv-transfer" in pair and any(x.startswith("gemm @ MainThread") or
                                                           x.startswith("mlp @ MainThread") for x in pair)
               for pair in pairs), pairs
    feedback = analyze(held, overlaps=[("kv.transfer", "gemm")])
    assert feedback.verdict == "fail" and "NEVER" in feedback.finding and "kv-transfer" in feedback.finding
    # With the GIL released the transfer may run during a GEMM, or may finish in the gaps: how often it
    # overlaps is measured over repeated runs in benchmarks/kv_transfer_gil.py, not asserted from one.
