"""weight_format gguf-a8 and gguf-a16: the file's blocks times activations as one or two int8 digits. The
native kernels (AVX-512 VNNI, AVX2 and the scalar path, whichever this CPU runs, the narrower ones forced)
against the torch reference that rounds the same way, on odd shapes, both block kinds and both digit counts;
the reference against the exact product (the only error is the activations' rounding, bounded); and the
real model through the engine, packed and not."""
from __future__ import annotations

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.quant.blocks import KIND_CODES, BlockLinear
from infragent.engine.quant.blocks_a8 import DIGITS, BlockLinearA8, quantize_activations, reference_a8
from test_weight_format import SHAPES, isas, needs_kernels, random_weight

pytestmark = pytest.mark.usefixtures("kernels_built")  # a compile error fails these tests (conftest)
A8_PATHS = {"avx512": ("avx512-vnni", "avx2"), "avx2": ("avx2",), "generic": ("generic",)}  # VNNI or not


@needs_kernels
@pytest.mark.parametrize("digits", [1, 2])
@pytest.mark.parametrize("kind", ["q4_1", "q8_0"])
def test_the_int8_activation_kernels_equal_the_reference(kind: str, digits: int, isa_restored) -> None:
    ran = set()
    for isa in isas():
        torch.ops.infragent.qgemm_set_isa(isa)
        path = torch.ops.infragent.qa8_isa()
        assert path in A8_PATHS[isa]
        ran.add(path)
        for i, (n, k, m) in enumerate(SHAPES):
            w = random_weight(kind, n, k, seed=i)
            if i % 2:
                w = w.scaled(0.125)
            x = torch.randn(m, k, generator=torch.Generator().manual_seed(100 + i))
            if i == 2:
                x[0, 32:64] = 0  # an all-zero block: scale 0, no division by zero
            y = BlockLinearA8(w, native=True, digits=digits)(x)
            reference = reference_a8(x, w, digits)
            error = ((y - reference).abs().max() / reference.abs().max()).item()
            assert y.shape == (m, n) and error < 1e-5, (path, n, k, m, error)
    assert "generic" in ran


@pytest.mark.parametrize("digits, half_step", [(1, 254), (2, 32512)])
def test_the_reference_differs_from_the_exact_product_only_by_the_activations_rounding(digits: int,
                                                                                      half_step: int) -> None:
    """Each activation moves by at most half a step (max|x_b| / 254 with one digit, / (254 * 128) with two),
    so |y - exact| is bounded by the sum over blocks of that step times the block's |w|."""
    for kind in ("q4_1", "q8_0"):
        w = random_weight(kind, 48, 576, seed=3)
        x = torch.randn(6, 576, generator=torch.Generator().manual_seed(4))
        dense = w.dequantize().double()
        exact = x.double() @ dense.t()
        step = x.reshape(6, 18, 32).abs().amax(-1).double() / half_step  # [m, blocks]
        bound = step @ dense.abs().reshape(48, 18, 32).sum(-1).t()  # [m, n]
        gap = (reference_a8(x, w, digits).double() - exact).abs()
        assert (gap <= bound * (1 + 1e-4) + 1e-9).all()
        assert gap.max() > 0  # it does round


def test_activations_are_quantized_per_block_to_nearest_even() -> None:
    x = torch.tensor([[127.0, 0.5, 1.5, -2.5, 0.25, 0.125] + [0.0] * 26 + [0.0] * 32])
    (xq,), xd, xs = quantize_activations(x)
    assert xq[0, :6].tolist() == [127, 0, 2, -2, 0, 0]  # ties to even, as the kernels' cvtps rounds
    assert xd.tolist() == [[1.0, 0.0]] and xs.tolist() == [[126.5 + 0.375, 0.0]]
    assert xq[0, 32:].abs().sum().item() == 0
    (first, second), xd, _ = quantize_activations(x, digits=2)
    assert torch.equal(first, xq) and second[0, :6].tolist() == [0, 64, -64, -64, 32, 16]  # 128 (t - round(t))
    assert xd.tolist() == [[1.0 / 128, 0.0]]


@needs_kernels
def test_packing_lets_the_stored_blocks_go_and_cannot_be_undone() -> None:
    w = random_weight("q4_1", 40, 96, seed=5)
    linear = BlockLinearA8(w, native=False)
    assert linear.weight is w and linear.weight_bytes() == w.nbytes
    linear.native = True
    assert linear.weight is None and linear.weight_bytes() >= w.nbytes  # rows padded to groups of 16
    with pytest.raises(ValueError, match="cannot go back"):
        linear.native = False
    with pytest.raises(ValueError, match="q4_1 or q8_0"):
        BlockLinearA8(random_weight("int8", 16, 32, seed=6), native=False)
    with pytest.raises(ValueError, match="digits: 3"):
        BlockLinearA8(w, native=False, digits=3)


@needs_kernels
def test_a_bad_packed_weight_is_refused_by_name() -> None:
    w = random_weight("q8_0", 20, 64, seed=7)
    packed, pd, pm = torch.ops.infragent.qpack_a8(w.qs, w.d, w.mins, KIND_CODES["q8_0"])
    with pytest.raises(RuntimeError, match="does not fit"):
        torch.ops.infragent.qlinear_a8(torch.randn(2, 64), packed, pd, pm, None, KIND_CODES["q8_0"], 40)
    with pytest.raises(RuntimeError, match="x has 32 columns"):
        torch.ops.infragent.qlinear_a8(torch.randn(2, 32), packed, pd, pm, None, KIND_CODES["q8_0"], 20)
    with pytest.raises(RuntimeError, match="digits 3: 1 or 2"):
        torch.ops.infragent.qlinear_a8(torch.randn(2, 64), packed, pd, pm, None, KIND_CODES["q8_0"], 20, 3)


@pytest.mark.parametrize("fields, words", [
    ({"weight_format": "gguf-a8", "model": "hybrid"}, "gguf-a8 reads the model file's blocks"),
    ({"weight_format": "gguf-a16", "dtype": "bfloat16"}, "does not combine with dtype"),
    ({"weight_format": "gguf-a8", "tensor_parallel_size": 2}, "does not combine with tensor_parallel_size"),
])
def test_gguf_a8_that_cannot_run_names_itself(fields: dict, words: str) -> None:
    with pytest.raises(ConfigError, match=words):
        EngineConfig(**fields)


def test_the_real_model_with_int8_activations_stays_close_to_its_exact_logits() -> None:
    """The engine's gguf-a8 model: every Q4_1/Q8_0 linear is the int8-activation one, the LM head's logits stay
    within 2% of the exact (gguf) ones, and the native path computes what the torch path computes."""
    from infragent.engine.llm_engine import LLMEngine

    hidden = torch.randn(4, 576, generator=torch.Generator().manual_seed(0))
    logits = {}
    for fmt, kernels in (("gguf", "auto"), ("gguf-a8", "auto"), ("gguf-a8", "torch"), ("gguf-a16", "auto")):
        engine = LLMEngine(EngineConfig(model="llama", weight_format=fmt, kernels=kernels, max_model_len=256,
                                        kv_cache_gb=0.05))
        try:
            linears = [getattr(owner, name) for owner, name in engine.model.linears()]
            expected = BlockLinear if fmt == "gguf" else BlockLinearA8
            assert all(isinstance(linear, expected) for linear in linears)
            assert {getattr(linear, "digits", 0) for linear in linears} == {DIGITS.get(fmt, 0)}
            logits[fmt, kernels] = engine.model.logits(hidden)
        finally:
            engine.close()
    exact, a8 = logits["gguf", "auto"], logits["gguf-a8", "auto"]
    assert 0 < ((a8 - exact).abs().max() / exact.abs().max()).item() < 0.02
    torch_path = logits["gguf-a8", "torch"]
    assert ((a8 - torch_path).abs().max() / torch_path.abs().max()).item() < 1e-5
    a16 = logits["gguf-a16", "auto"]
    assert ((a16 - exact).abs().max() / exact.abs().max()).item() < 1e-3
