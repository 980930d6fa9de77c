"""Quantization: round trips within each format's theoretical bound, W8A8 arithmetic, the per-block KV scales,
and the engine's quantized configurations on the real model (bytes per token, prompt log-probabilities)."""
from __future__ import annotations

import gc

import pytest
import torch

from infragent.engine.config import ConfigError, EngineConfig
from infragent.engine.quant.formats import FORMATS, dequantize, quantize
from infragent.engine.quant.kv_quant import read_blocks, write_scaled
from infragent.engine.quant.linear import Int8WeightLinear, W8A8Linear
from infragent.engine.quant.smoothquant import smoothing_factors


def spread_values(rows: int = 64, cols: int = 128, seed: int = 0) -> torch.Tensor:
    """Rows whose magnitudes span 1e-4 to 1e3, with an outlier per row and some exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=g) * torch.logspace(-4, 3, rows)[:, None]
    x[:, 7] *= 30.0
    x[::5, 11] = 0.0
    return x


@pytest.mark.parametrize("name", ["int8", "fp8", "bf16"])
def test_round_trip_stays_within_the_theoretical_bound(name):
    fmt = FORMATS[name]
    x = spread_values()
    stored, scale = quantize(x, fmt)
    assert stored.dtype == fmt.dtype
    back = dequantize(stored, scale)
    err = (x - back).abs()
    bound = fmt.error_bound(x, scale.expand_as(x))
    assert bool((err <= bound).all()), f"{name}: worst excess {(err - bound).max():.3g}"
    # the bound is not vacuous: some element uses at least a third of it
    assert float((err / bound.clamp_min(1e-30)).max()) > 0.33
    assert bool((back[x == 0] == 0).all())


def test_all_zero_rows_round_trip_exactly():
    stored, scale = quantize(torch.zeros(3, 8), FORMATS["int8"])
    assert bool((dequantize(stored, scale) == 0).all()) and bool((scale == 1).all())


@pytest.mark.parametrize("name", ["int8", "fp8"])
def test_kv_block_scale_grows_and_each_row_stays_within_its_roundings(name):
    fmt = FORMATS[name]
    blocks, heads, size, dim = 3, 2, 16, 8
    data = torch.zeros(blocks, heads, size, dim, dtype=fmt.dtype)
    scale = torch.zeros(blocks, heads)
    g = torch.Generator().manual_seed(1)
    rows = torch.randn(size, heads, dim, generator=g) * torch.linspace(0.1, 5.0, size)[:, None, None]
    block = torch.full((1,), 1)
    encodings = torch.zeros(size, heads)  # how often each row has been rounded: once, plus once per growth
    for t in range(size):  # decode-style: one token per write, mostly larger than the last
        before = scale[1].clone()
        write_scaled(data, scale, block, torch.tensor([t]), rows[t:t + 1], fmt)
        encodings[:t] += (scale[1] > before).float() * (t > 0)
        encodings[t] = 1
    back = read_blocks(data, scale, torch.tensor([1]), torch.empty(1, heads, size, dim))[0].transpose(0, 1)
    final = scale[1][None, :, None].expand(size, heads, dim)
    assert torch.allclose(final[0, :, 0], rows.abs().amax(dim=(0, 2)) / fmt.qmax)
    assert int(encodings.max()) > 3  # the scale really grew several times
    err = (rows - back).abs()
    # every rounding used a scale no larger than the final one
    assert bool((err <= encodings[:, :, None] * fmt.error_bound(rows, final)).all())
    assert bool((data[0] == 0).all()) and bool((data[2] == 0).all())  # other blocks untouched


def test_kv_block_reused_from_offset_zero_forgets_its_old_scale():
    fmt = FORMATS["int8"]
    data, scale = torch.zeros(1, 1, 4, 2, dtype=torch.int8), torch.zeros(1, 1)
    write_scaled(data, scale, torch.tensor([0]), torch.tensor([0]), torch.full((1, 1, 2), 100.0), fmt)
    write_scaled(data, scale, torch.tensor([0]), torch.tensor([0]), torch.full((1, 1, 2), 0.5), fmt)
    assert float(scale[0, 0]) == pytest.approx(0.5 / 127)


def test_w8a8_is_int32_accumulation_of_the_int8_operands():
    g = torch.Generator().manual_seed(2)
    w, x = torch.randn(96, 40, generator=g), torch.randn(5, 96, generator=g)
    linear = W8A8Linear(w)
    qx, sx = quantize(x, FORMATS["int8"], dim=-1)
    exact = (qx.double() @ linear.qweight.double()) * sx.double() * linear.scale.double()
    assert torch.allclose(linear(x).double(), exact, rtol=1e-6, atol=1e-6)
    rel = float((linear(x) - x @ w).norm() / (x @ w).norm())
    assert 1e-4 < rel < 0.02  # really quantized, and close


@pytest.mark.parametrize("k", [96, 1536, 2100])  # one exact fp32 product; longer rows summed in slices
def test_w8a8_gives_the_same_bits_through_int_mm_and_through_the_exact_fp32_product(k: int, monkeypatch):
    from infragent.engine.quant import linear as linear_module

    g = torch.Generator().manual_seed(k)
    w, x = torch.randn(k, 48, generator=g), torch.randn(19, k, generator=g)
    w[:, :8] = 1 + 0.01 * torch.rand(k, 8, generator=g)  # 8 outputs and 9 rows of products all near 127^2:
    x[:9] = 1 + 0.01 * torch.rand(9, k, generator=g)  # for k > 1040 their sums pass 2^24 (fp32 rounds them)
    outputs = []
    for fast in (True, False):
        monkeypatch.setattr(linear_module, "int_mm_is_fast", lambda fast=fast: fast)
        layer = W8A8Linear(w)
        assert layer.int_mm == fast
        outputs.append(layer(x))
    assert torch.equal(outputs[0], outputs[1])


def test_int8_weight_only_keeps_activations_exact():
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(64, 48, generator=g), torch.randn(7, 64, generator=g)
    linear = Int8WeightLinear(w)
    expected = x @ (linear.qweight.float() * linear.scale)
    assert torch.allclose(linear(x), expected, rtol=1e-5, atol=1e-5)
    assert linear.weight_bytes() == 64 * 48 + 48 * 4


def test_smoothquant_moves_an_activation_outlier_into_the_weights():
    g = torch.Generator().manual_seed(4)
    w, x = torch.randn(64, 32, generator=g) * 0.1, torch.randn(16, 64, generator=g)
    x[:, 3] *= 80.0  # one outlier channel, as LLM activations have
    factors = smoothing_factors(x.abs().amax(dim=0), w, alpha=0.5)
    plain, smooth = W8A8Linear(w), W8A8Linear(w, factors)
    truth = x @ w
    err = [float((lin(x) - truth).norm() / truth.norm()) for lin in (plain, smooth)]
    assert err[1] < err[0] / 2


def test_config_names_the_bad_quantization_field():
    with pytest.raises(ConfigError, match="kv_cache_dtype: 'int4'"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ConfigError, match=r"kv_cache_dtypes\[1\]"):
        EngineConfig(kv_cache_dtypes=["int8", "e5m2"])
    with pytest.raises(ConfigError, match="needs kv_layout paged"):
        EngineConfig(kv_cache_dtype="int8", kv_layout="contiguous")
    with pytest.raises(ConfigError, match="smoothquant_alpha: applies to quantization w8a8"):
        EngineConfig(smoothquant_alpha=0.5)
    with pytest.raises(ConfigError, match="quantization: needs gemm torch"):
        EngineConfig(quantization="w8a8", gemm="blas")
    assert EngineConfig(quantization="none").quantization is None


class _Engines:
    """The real model with fp32 weights (what quantization replaces), plain and with each KV dtype and weight
    quantization, built on first use: plain stays, and of the others only the last one asked for (each holds
    its own copy of the weights, about 0.6 GB)."""

    KNOBS = {"fp32": {}, "bf16": {"kv_cache_dtype": "bf16"}, "fp8": {"kv_cache_dtype": "fp8"},
             "int8": {"kv_cache_dtype": "int8"}, "w8a8": {"quantization": "w8a8"}}

    def __init__(self) -> None:
        self.built: dict = {}

    def __getitem__(self, name: str):  # noqa: ANN204 - an LLMEngine
        from infragent.engine.llm_engine import LLMEngine

        if name not in self.built:
            for other in [k for k in self.built if k != "fp32"]:
                self.built.pop(other).close()
            gc.collect()
            self.built[name] = LLMEngine(EngineConfig(model="llama", kv_cache_gb=0.1, max_model_len=512,
                                                      weight_format="fp32", **self.KNOBS[name]))
        return self.built[name]

    def release(self) -> None:
        """Close and drop every engine built so far (before a test builds engines of its own)."""
        for engine in self.built.values():
            engine.close()
        self.built.clear()
        gc.collect()


@pytest.fixture(scope="module")
def engines():
    """The engines by name, built when first asked for; all of them released after the module."""
    built = _Engines()
    yield built
    built.release()


def test_kv_bytes_per_token_by_dtype(engines):
    fp32 = engines["fp32"].kv_cache.nbytes_per_token()
    assert fp32 == 30 * 2 * 3 * 64 * 4  # SmolLM2: 30 layers, K and V, 3 KV heads of 64
    assert engines["bf16"].kv_cache.nbytes_per_token() == fp32 / 2
    for name in ("fp8", "int8"):
        ratio = engines[name].kv_cache.nbytes_per_token() / fp32
        assert 0.25 < ratio <= 0.25 * 1.03, name  # a quarter, plus the per-block, per-head scales


def test_w8a8_weights_take_a_quarter(engines):
    ratio = engines["w8a8"].model.projection_bytes() / engines["fp32"].model.projection_bytes()
    assert 0.25 < ratio < 0.26


def test_kv_layers_can_differ_and_the_cache_holds_more_tokens_in_the_same_memory(engines):
    from infragent.engine.llm_engine import LLMEngine

    engines.release()  # its own engine, not on top of the module's

    names = ["int8"] * 10 + ["fp8"] * 10 + ["bf16"] * 10
    engine = LLMEngine(EngineConfig(model="llama", kv_cache_gb=0.1, max_model_len=512, kv_cache_dtypes=names))
    dtypes = [t.dtype for t in engine.kv_cache.k]
    assert dtypes[0] == torch.int8 and dtypes[10] == torch.float8_e4m3fn and dtypes[29] == torch.bfloat16
    fp32_blocks = int(0.1e9 // (30 * 2 * 3 * 64 * 4)) // 16
    assert engine.blocks.num_blocks > 2.5 * fp32_blocks
    with pytest.raises(ConfigError, match="kv_cache_dtypes: has 2 entries for 30 attention layers"):
        LLMEngine(EngineConfig(model="llama", kv_cache_gb=0.1, max_model_len=512, kv_cache_dtypes=["int8"] * 2))


def test_prompt_logprobs_are_the_models_distributions(engines, llama_weights):
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams
    from reference_forward import reference_logits

    llm = LLM.from_engine(engines["fp32"])
    ids = llm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    params = SamplingParams(max_tokens=2, prompt_logprobs=True)
    first, again = llm.generate([ids, ids], params)
    expected = torch.log_softmax(reference_logits(*llama_weights, ids), dim=-1)
    assert first.prompt_logprobs.shape == (len(ids), expected.shape[1])
    assert torch.allclose(first.prompt_logprobs, expected, atol=2e-3)
    assert again.num_cached_tokens == 0 and torch.equal(first.prompt_logprobs, again.prompt_logprobs)
    assert int(first.prompt_logprobs[-1].argmax()) == first.token_ids[0]


def test_quantized_kv_changes_the_distributions_but_not_much(engines):
    from infragent.probes.quality import QualityPlan, quality

    plan = QualityPlan(windows=4, window=128, prompts=6, max_tokens=8, batch=4)
    same = quality(engines["fp32"], engines["fp32"], plan).numbers
    assert same["perplexity_increase"].value == 0 and same["kl_divergence"].value == 0
    assert same["greedy_agreement"].value == 1
    int8 = quality(engines["fp32"], engines["int8"], plan).numbers
    assert 0 < int8["kl_divergence"].value < 0.02
    assert abs(int8["perplexity_increase"].value) < 0.02


def test_hybrid_model_runs_quantized():
    from infragent.engine.config import HybridConfig
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    small = HybridConfig(hidden_size=128, intermediate_size=256, num_layers=4, num_heads=4, num_kv_heads=2,
                         head_dim=32, kda_num_heads=2, kda_head_k_dim=32, kda_head_v_dim=32)
    outputs = {}
    for name, knobs in {"fp32": {}, "quant": {"kv_cache_dtype": "int8", "quantization": "w8a8",
                                              "smoothquant_alpha": 0.5}}.items():
        llm = LLM(model="hybrid", hybrid=small, kv_cache_gb=0.01, max_model_len=256, **knobs)
        outputs[name] = llm.generate(["Hello there", "A longer prompt " * 8],
                                     SamplingParams(max_tokens=6, ignore_eos=True))
    assert all(len(o.token_ids) == 6 and o.error is None for o in outputs["quant"])


def test_quant_gates_pack_passes_int8_kv_and_rejects_w8a8_without_smoothing(engines):
    from infragent.agent.targets.serving_gates import quality_gate
    from infragent.lab.spec import PACKS, load_spec
    from infragent.probes.quality import QualityPlan

    engines.release()  # each gate builds two engines of its own
    spec = load_spec(PACKS / "quant-gates" / "spec.toml")
    plan = QualityPlan(windows=12, window=128, prompts=8, max_tokens=8, batch=6)
    kv = quality_gate(spec, {"kv_cache_dtype": "int8", "quantization": "none"}, plan)
    assert kv.verdict == "pass", kv.finding
    w8a8 = quality_gate(spec, {"kv_cache_dtype": "auto", "quantization": "w8a8"}, plan)
    assert w8a8.verdict == "fail" and "perplexity_increase" in w8a8.finding, w8a8.finding
    assert {j["metric"] for j in w8a8.details["judgements"]} == {"perplexity_increase", "kl_divergence",
                                                                 "greedy_agreement"}
    bad = quality_gate(spec, {"kv_cache_dtype": "int4"}, plan)
    assert bad.verdict == "fail" and "kv_cache_dtype: 'int4'" in bad.finding
