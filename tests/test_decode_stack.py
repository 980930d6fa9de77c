"""The native decode stack (models/decode_stack.py): bit for bit the Python layer path on the real model, for
each weight format it runs and for decode batches of unequal contexts; taken only by decode-only steps with
nothing recording; planned again when a linear is swapped; off, with the reason, when the Python functions it
mirrors are not the ones verified."""
from __future__ import annotations

import logging
import shutil

import pytest
import torch

from infragent import trace
from infragent.engine.config import EngineConfig
from infragent.engine.llm_engine import LLMEngine
from infragent.engine.models import decode_stack
from infragent.engine.models.decoder import DecoderModel
from infragent.engine.quant.smoothquant import InputRange
from infragent.engine.sampling import SamplingParams

pytestmark = [pytest.mark.usefixtures("kernels_built"),
              pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler here to build the native kernels")]
PROMPTS = [[1, 504, 3458, 282, 4649, 314], [1, 563, 14881, 26, 6, 1435, 339, 42] * 5, [1, 22862, 1768, 288] * 9]


def test_the_mirrored_python_is_the_one_verified() -> None:
    """A change to a mirrored function turns the stack off until this module passes again: then set VERIFIED."""
    assert decode_stack.source_digest(DecoderModel) == decode_stack.VERIFIED, (
        f"the Python layer path changed: if the other tests here pass, set decode_stack.VERIFIED = "
        f"{decode_stack.source_digest(DecoderModel)!r}")


def engine(fmt: str, **fields) -> LLMEngine:
    fields = {"model": "llama", **fields}
    return LLMEngine(EngineConfig(weight_format=fmt, max_model_len=256, kv_cache_gb=0.05, **fields))


def decode_batch(eng: LLMEngine, prompts: list[list[int]]):
    """A scheduled batch of decode rows only: the prompts prefilled and one token decoded each."""
    for p in prompts:
        eng.add_request(p, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    while any(s.num_computed_tokens < len(s.prompt_token_ids) for s in eng.scheduler.running + list(eng.scheduler.waiting)):
        eng.step()
    eng.step()
    return eng.scheduler.schedule()


@pytest.mark.parametrize("fmt", ["gguf", "gguf-a16", "fp32"])
@pytest.mark.parametrize("rows", [1, 3])
def test_a_decode_step_through_the_stack_is_the_python_path_bit_for_bit(fmt: str, rows: int) -> None:
    eng = engine(fmt)
    try:
        model = eng.model
        batch = decode_batch(eng, PROMPTS[:rows])
        outs = {}
        with torch.inference_mode():
            for on in (False, True, False):  # the cache rows it writes are the same ones, rewritten
                model.use_decode_stack = on
                inputs, _ = eng.runner.prepare(batch)
                outs.setdefault(on, []).append(model.forward(inputs, eng.kv_cache, eng.kda_states))
            model.use_decode_stack = True
            stack, why = decode_stack.build(model, eng.kv_cache)
            assert stack is not None and stack.takes(inputs), why
        assert torch.equal(outs[False][0], outs[False][1])
        assert torch.equal(outs[True][0], outs[False][0])
    finally:
        eng.close()


def test_greedy_generation_is_unchanged_and_decode_steps_take_the_stack(monkeypatch) -> None:
    taken = []
    real_run = decode_stack.DecodeStack.run
    monkeypatch.setattr(decode_stack.DecodeStack, "run", lambda self, h, i: taken.append(len(h)) or real_run(self, h, i))
    tokens = {}
    for on in (True, False):
        eng = engine("gguf")
        eng.model.use_decode_stack = on
        try:
            params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
            seqs = [eng.add_request(p, params) for p in PROMPTS]
            while eng.has_unfinished():
                eng.step()
            tokens[on] = [list(s.output_token_ids) for s in seqs]
        finally:
            eng.close()
    assert tokens[True] == tokens[False]
    assert len(taken) >= 14 and set(taken) <= {1, 2, 3}


def test_prefill_rows_a_recording_or_a_kv_transfer_keep_the_python_path() -> None:
    eng = engine("gguf")
    try:
        batch = decode_batch(eng, PROMPTS[:2])
        inputs, _ = eng.runner.prepare(batch)
        stack = eng.model._decode_stack(eng.kv_cache)
        assert stack.takes(inputs)
        with trace.Recorder():
            assert not stack.takes(inputs)
        eng.add_request(PROMPTS[2], SamplingParams(max_tokens=2))
        mixed, _ = eng.runner.prepare(eng.scheduler.schedule())
        assert mixed.prefills and not stack.takes(mixed)
        eng.kv_cache.transfer = object()
        try:
            assert not stack.takes(inputs)
        finally:
            eng.kv_cache.transfer = None
    finally:
        eng.close()


def test_a_swapped_linear_is_seen_and_a_changed_mirror_turns_the_stack_off(monkeypatch, caplog) -> None:
    caplog.set_level(logging.INFO)
    eng = engine("gguf")
    try:
        model = eng.model
        first = model._decode_stack(eng.kv_cache)
        assert first is not None
        _, mixer, _, _ = model.layers[3]
        held = mixer.o
        mixer.o = InputRange(held)  # a calibration wrapper: the stack would skip it, so it must not run
        assert model._decode_stack(eng.kv_cache) is None
        assert "InputRange linear (o)" in caplog.text
        mixer.o = held
        assert model._decode_stack(eng.kv_cache) is not None
        monkeypatch.setattr(decode_stack, "VERIFIED", "another source")
        model._forget_stack()
        assert model._decode_stack(eng.kv_cache) is None
        assert "the Python layer path it mirrors changed" in caplog.text
    finally:
        eng.close()


def test_the_kda_hybrid_and_an_int8_kv_cache_are_refused_with_their_reason() -> None:
    for fields, words in (({"model": "hybrid", "weight_format": "fp32"}, "a KDA mixer"),
                          ({"kv_cache_dtype": "int8"}, "KV layer 0 is stored as int8")):
        fmt = fields.pop("weight_format", "gguf")
        eng = engine(fmt, **fields)
        try:
            stack, why = decode_stack.build(eng.model, eng.kv_cache)
            assert stack is None and words in why, why
        finally:
            eng.close()
