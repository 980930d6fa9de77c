"""Weights at the bits they are stored in. The native kernels against dequantize-then-matmul for every block
kind, odd shapes and every instruction set this CPU has (the AVX2 path runs on an AVX-512 machine too, also
forced through $INFRAGENT_ISA in a fresh process); the file's blocks regrouped without changing a bit; and
the real model with weight_format gguf computing what fp32 computes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.gguf_weights import GGML_KINDS, _dequantize_into, read_gguf
from infragent.engine.kernels import build
from infragent.engine import weight_choice
from infragent.engine.quant.blocks import KIND_CODES, BlockLinear, BlockWeight, from_gguf, quantize_int8, stack_rows
from infragent.engine.weight_choice import candidates, decide

# with a compiler the kernels must build (conftest's kernels_built: a compile error fails, as in test_kernels.py)
needs_kernels = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler here to build the native kernels")
pytestmark = pytest.mark.usefixtures("kernels_built")
SHAPES = [(37, 64, 1), (5, 32, 3), (129, 576, 1), (130, 96, 17), (1, 32, 64), (64, 1536, 33), (33, 64, 65),
          (19, 96, 300), (6, 4128, 1)]  # (n, k, m): m activation rows; a prefill chunk runs the same kernel;
# k = 4128: a batch-1 row of 129 blocks, more than one run of converted scales (kScaleRun = 64)


def random_weight(kind: str, n: int, k: int, seed: int) -> BlockWeight:
    """Random blocks of a kind, with scales the size real files carry."""
    g = torch.Generator().manual_seed(seed)
    if kind == "q4_1":
        return BlockWeight(kind, torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, generator=g),
                           (torch.rand(n, k // 32, generator=g) * 0.02).half(),
                           (torch.randn(n, k // 32, generator=g) * 0.1).half())
    if kind == "q8_0":
        return BlockWeight(kind, torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g),
                           (torch.rand(n, k // 32, generator=g) * 0.01).half())
    return quantize_int8(torch.randn(n, k, generator=g))


def isas() -> list[str]:
    """The instruction sets this CPU runs, widest first."""
    build.load()
    widest = ["generic", "avx2", "avx512"].index(torch.ops.infragent.qgemm_isa())
    return ["avx512", "avx2", "generic"][2 - widest:]


@needs_kernels
@pytest.mark.parametrize("kind", ["q4_1", "q8_0", "int8"])
def test_the_kernels_equal_dequantize_then_matmul(kind: str, isa_restored) -> None:
    for isa in isas():
        torch.ops.infragent.qgemm_set_isa(isa)
        for i, (n, k, m) in enumerate(SHAPES):
            w = random_weight(kind, n, k, seed=i)
            if i % 2:
                w = w.scaled(0.125)  # a folded row scale, as W_q carries the softmax scale
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(100 + i))
            reference = x.double() @ w.dequantize().double().t()
            y = torch.ops.infragent.qlinear(x, w.qs, w.d, w.mins, w.row_scale, KIND_CODES[kind])
            error = ((y.double() - reference).abs().max() / reference.abs().max()).item()
            assert y.shape == (m, n) and error < 1e-5, (isa, n, k, m, error)
            dense = w.dequantize(native=True)
            assert (dense - w.dequantize()).abs().max().item() <= 1e-6 * w.dequantize().abs().max().item()
            rows = torch.tensor([n - 1, 0, n // 2])
            assert torch.equal(w.dequantize(rows, native=True), dense[rows])


@needs_kernels
def test_the_avx2_path_is_forced_by_the_environment_in_a_fresh_process(tmp_path) -> None:
    if "avx2" not in isas():
        pytest.skip("this CPU has no AVX2")
    w = random_weight("q4_1", 67, 576, seed=7)
    x = torch.randn(3, 576, generator=torch.Generator().manual_seed(8))
    torch.save({"w": w.__dict__, "x": x}, tmp_path / "case.pt")
    script = (f"import torch\nfrom infragent.engine.kernels import build\nbuild.load()\n"
              f"case = torch.load({str(tmp_path / 'case.pt')!r})\nw = case['w']\n"
              f"y = torch.ops.infragent.qlinear(case['x'], w['qs'], w['d'], w['mins'], w['row_scale'], 0)\n"
              f"torch.save(y, {str(tmp_path / 'y.pt')!r})\nprint(torch.ops.infragent.qgemm_isa())")
    done = subprocess.run([sys.executable, "-c", script], env={**os.environ, "INFRAGENT_ISA": "avx2"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "avx2"
    reference = x.double() @ w.dequantize().double().t()
    assert (torch.load(tmp_path / "y.pt").double() - reference).abs().max() / reference.abs().max() < 1e-5


@needs_kernels
def test_an_isa_the_cpu_lacks_or_an_unknown_name_is_refused_by_name(isa_restored) -> None:
    with pytest.raises(RuntimeError, match="choose auto, avx512, avx2 or generic"):
        torch.ops.infragent.qgemm_set_isa("sse9")
    if isas()[0] != "avx512":
        with pytest.raises(RuntimeError, match="this CPU's widest is"):
            torch.ops.infragent.qgemm_set_isa("avx512")


def test_the_files_blocks_regroup_without_changing_a_bit() -> None:
    gguf = read_gguf()
    for ggml_type in GGML_KINDS:
        name = next(n for n, t in gguf.tensors.items() if t.ggml_type == ggml_type and len(t.shape) == 2)
        info, raw = gguf.tensors[name], gguf.read_tensor_bytes(name)
        expected = torch.empty(info.shape)
        _dequantize_into(raw, ggml_type, expected.numpy())
        blocks = from_gguf(raw, ggml_type, info.shape)
        assert torch.equal(blocks.dequantize(), expected), name  # the same arithmetic as the fp32 load
        assert blocks.nbytes == info.nbytes


def test_rows_taken_and_stacked_keep_their_blocks() -> None:
    a, b = random_weight("q4_1", 6, 64, seed=1), random_weight("q4_1", 4, 64, seed=2).scaled(0.5)
    fused = stack_rows([a, b])
    assert torch.equal(fused.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    order = torch.tensor([9, 0, 3])
    assert torch.equal(fused.rows(order).dequantize(), fused.dequantize()[order])
    with pytest.raises(ValueError, match="different block kinds"):
        stack_rows([a, random_weight("q8_0", 2, 64, seed=3)])


def test_without_the_kernels_a_block_linear_dequantizes_and_agrees() -> None:
    w = random_weight("q8_0", 40, 96, seed=4)
    x = torch.randn(5, 96)
    assert torch.allclose(BlockLinear(w, native=False)(x), x @ w.dequantize().t(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fields, words", [
    ({"weight_format": "q4"}, "weight_format: 'q4'; choose one of auto, fp32, gguf, gguf-a16, gguf-a8, int8"),
    ({"weight_format": "gguf", "model": "hybrid"}, "the hybrid model has no file"),
    ({"weight_format": "gguf", "quantization": "w8a8"}, "does not combine with quantization"),
    ({"weight_format": "int8", "dtype": "bfloat16"}, "does not combine with dtype"),
])
def test_a_weight_format_that_cannot_run_names_itself(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        EngineConfig(**fields)


def test_gguf_weights_compute_what_fp32_computes_on_the_real_model() -> None:
    """Greedy tokens equal, logits within 1e-4 relative, the weights a fifth of fp32's bytes (the must-show's
    64 x 64 run is benchmarks/weight_format_exactness.py)."""
    from infragent.engine.llm_engine import LLMEngine
    from infragent.engine.sampling import SamplingParams

    prompts = [[1, 504, 3458, 282, 4649, 314], [1, 563, 14881, 26, 6, 1435, 339, 42], [1, 22862, 1768, 288] * 9]
    results = {}
    for fmt in ("fp32", "gguf"):
        engine = LLMEngine(EngineConfig(model="llama", weight_format=fmt, max_model_len=256, kv_cache_gb=0.05))
        try:
            params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
            seqs = [engine.add_request(p, params) for p in prompts]
            while engine.has_unfinished():
                engine.step()
            hidden = torch.randn(4, engine.model.shape.hidden_size, generator=torch.Generator().manual_seed(0))
            results[fmt] = {"tokens": [list(s.output_token_ids) for s in seqs], "logits": engine.model.logits(hidden),
                            "bytes": engine.model.nbytes()}
        finally:
            engine.close()
    assert results["gguf"]["tokens"] == results["fp32"]["tokens"]
    a, b = results["gguf"]["logits"], results["fp32"]["logits"]
    assert ((a - b).abs().max() / b.abs().max()).item() <= 1e-4
    assert results["gguf"]["bytes"] < results["fp32"]["bytes"] / 4, json.dumps({k: v["bytes"] for k, v in results.items()})


@pytest.mark.parametrize("fields, options", [
    ({}, ("fp32", "gguf")),
    ({"weight_format": "gguf"}, ("gguf",)),
    ({"weight_format": "int8"}, ("int8",)),
    ({"model": "hybrid"}, ("fp32",)),  # no file blocks: auto never picks int8, which changes the numbers
    ({"quantization": "w8a8"}, ("fp32",)),
    ({"gemm": "blas"}, ("fp32",)),
    ({"dtype": "bfloat16"}, ("fp32",)),
])
def test_auto_chooses_only_among_formats_with_the_models_outputs(fields: dict, options: tuple) -> None:
    assert candidates(EngineConfig(**fields)) == options


def test_the_choice_follows_the_measured_ratios() -> None:
    assert decide({1: [3.1, 2.9, 3.0], 32: [1.2, 1.1, 1.3], 128: [0.9, 0.95, 0.92]}).format == "gguf"
    slower = decide({1: [0.5, 0.6, 0.55], 32: [0.8, 0.9, 0.7], 128: [1.1, 1.0, 1.05]})
    assert slower.format == "fp32" and "1 rows x0.55" in slower.reason and "geometric mean x0.7" in slower.reason


@pytest.mark.parametrize("chunk, counts", [(64, (1, 8, 32, 64)), (512, (1, 8, 32, 128, 512)),
                                           (2048, (1, 8, 32, 128, 512, 2048)), (8192, (1, 8, 32, 128, 512, 2048))])
def test_auto_measures_the_row_counts_a_step_can_run(chunk: int, counts: tuple) -> None:
    config = EngineConfig(model="llama", max_num_batched_tokens=chunk, max_num_seqs=min(32, chunk),
                          max_model_len=256)
    assert weight_choice.row_counts(config) == counts


def test_dequantize_and_blas_take_the_row_counts_from_where_they_win_at_every_count_above() -> None:
    fp32_over_tile = {1: [3.0] * 3, 8: [2.0] * 3, 32: [1.5] * 3, 128: [1.2] * 3, 512: [0.8] * 3}
    tile_over_blas = {1: [0.2] * 3, 8: [1.3] * 3, 32: [0.9] * 3, 128: [1.1] * 3, 512: [1.4] * 3}
    split = decide(fp32_over_tile, tile_over_blas)  # 8 rows favour BLAS too, but 32 do not: only 128 and up
    assert split.format == "gguf" and split.blas_from == 128
    assert "below 128 rows, from 128 on the blocks dequantized + BLAS (x1.10" in split.reason
    tie = decide(fp32_over_tile, {**tile_over_blas, 128: [1.04] * 3})  # within the margin: the tile kernel
    assert tie.blas_from == 512
    assert "512 rows x1.12" in split.reason  # 0.8 x 1.4: what the blocks give there, run their faster way
    never = decide(fp32_over_tile, {rows: [0.9] * 3 for rows in fp32_over_tile})
    assert never.blas_from is None and "the tile kernel at every row count" in never.reason
    slower = decide({1: [0.5] * 3, 512: [0.4] * 3}, {1: [0.1] * 3, 512: [2.0] * 3})
    assert slower.format == "fp32" and slower.blas_from is None


@needs_kernels
def test_a_product_from_blas_from_rows_on_is_blas_on_the_dequantized_blocks(monkeypatch) -> None:
    from infragent.engine.quant import blocks

    w = random_weight("q4_1", 200, 96, seed=3).scaled(0.5)
    dense = w.dequantize(native=True)
    linear = BlockLinear(w, native=True, blas_from=16)
    small, large = torch.randn(15, 96), torch.randn(16, 96)
    assert torch.equal(linear(large), torch.mm(large, dense.t()))
    assert torch.equal(linear(small), BlockLinear(w, native=True)(small))  # below: the tile kernel
    assert torch.allclose(linear(small), torch.mm(small, dense.t()), rtol=1e-5, atol=1e-5)
    monkeypatch.setattr(blocks, "DEQUANTIZED_ROWS", 64)  # W dequantized 64 rows at a time: the same product
    assert torch.allclose(linear(large), torch.mm(large, dense.t()), rtol=1e-6, atol=1e-6)


def test_blocks_dequantized_in_place_hold_exactly_what_fp32_loads() -> None:
    from infragent.engine.models.decoder import DecoderModel
    from infragent.engine.models.llama import load_llama

    shape, stored = load_llama(blocks=True)
    held = DecoderModel(shape, stored, torch.float32, consume=True)
    held.hold_fp32()
    shape, loaded = load_llama()
    fp32 = DecoderModel(shape, loaded, torch.float32, consume=True)
    assert not held.block_kernels and torch.equal(held.embed, fp32.embed)
    for (owner_a, name), (owner_b, _) in zip(held.linears(), fp32.linears()):
        a, b = getattr(owner_a, name), getattr(owner_b, name)
        assert type(a) is type(b) and torch.equal(a.weight_t, b.weight_t), name


@needs_kernels
def test_auto_measures_once_per_machine_and_keeps_the_choice(tmp_path, monkeypatch) -> None:
    from infragent.engine.llm_engine import LLMEngine

    monkeypatch.setenv("INFRAGENT_KERNEL_CACHE", str(tmp_path / "kernels"))  # the built library is reused
    monkeypatch.setattr(weight_choice, "ROUNDS", 2)
    engines = []
    try:
        for _ in range(2):
            engines.append(LLMEngine(EngineConfig(model="llama", max_model_len=256, kv_cache_gb=0.05)))
        first, second = (e.weight_choice for e in engines)
        assert first.format in ("fp32", "gguf") and first.reason.startswith("auto: measured here")
        assert set(first.speedups) == set(first.blas_speedups) == {1, 8, 32, 128, 512}  # 512: the prefill chunk
        assert all(len(s) == 2 for s in first.speedups.values())
        assert first.blas_from is None or (first.format == "gguf" and first.blas_from in first.speedups)
        if first.cache is None:  # measured while the CPU was contended: not kept, so the second measured again
            assert "contended" in first.reason and second.reason.startswith("auto: measured here")
        else:
            assert second.to_dict() == first.to_dict()
            assert json.loads(open(first.cache).read())["format"] == first.format
        model = engines[0].model
        assert model.block_kernels == (first.format == "gguf")
        assert isinstance(model.lm_head, BlockLinear) == (first.format == "gguf")
        if first.format == "gguf":
            assert model.lm_head.blas_from == model.layers[0][3].down.blas_from == first.blas_from
    finally:
        for engine in engines:
            engine.close()


@needs_kernels
def test_a_measurement_taken_while_the_cpu_was_contended_is_not_kept(tmp_path, monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setenv("INFRAGENT_KERNEL_CACHE", str(tmp_path / "kernels"))
    monkeypatch.setattr(weight_choice, "ROUNDS", 2)
    site = SimpleNamespace(proj=BlockLinear(random_weight("q4_1", 64, 128, seed=1), native=True),
                           head=BlockLinear(random_weight("q8_0", 256, 128, seed=2), native=True))
    linears = [(site, "proj"), (site, "head")]
    model_file = tmp_path / "model.gguf"
    model_file.write_bytes(b"0" * 100)
    config = EngineConfig(model="llama", num_threads=1)
    waits = iter([0, 10**12])  # a thousand seconds in the run queue during the measurement
    monkeypatch.setattr(weight_choice, "run_queue_ns", lambda: next(waits))
    busy = weight_choice.choose(config, model_file, linears, True, 4)
    assert "contended" in busy.reason and busy.cache is None and not (tmp_path / "kernels").exists()
    monkeypatch.setattr(weight_choice, "run_queue_ns", lambda: 0)
    quiet = weight_choice.choose(config, model_file, linears, True, 4)
    assert quiet.cache is not None and "contended" not in quiet.reason
    assert weight_choice.choose(config, model_file, linears, True, 4).to_dict() == quiet.to_dict()  # kept
