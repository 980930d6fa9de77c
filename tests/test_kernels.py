"""The native kernels (engine/kernels) against the torch ops they replace, and their input checks."""
import shutil

import pytest
import torch

from infragent.engine.kernels.build import load, use_native_kernels
from infragent.engine.config import ConfigError
from infragent.engine.models.layers import Rotary, decode_attention
from infragent.engine.quant.formats import FORMATS
from infragent.engine.quant.kv_quant import write_scaled

# Without a compiler they cannot build (the engine then runs torch ops: the failed-build test at the end
# simulates that); with one, they must build, and a compile error fails every test here.
pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="no C++ compiler here")


@pytest.fixture(autouse=True, scope="module")
def built_kernels():
    load()  # raises KernelBuildError with the compiler's first error


def _cache(blocks: int, kv_heads: int, block_size: int, dim: int, gen: torch.Generator) -> tuple:
    shape = (blocks, kv_heads, block_size, dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [(9, 3, 64, 16), (8, 2, 64, 16), (4, 4, 32, 8),
                                                          (6, 1, 16, 5)])
def test_paged_decode_attention_matches_gathered_attention(heads, kv_heads, dim, block_size):
    gen = torch.Generator().manual_seed(heads * 100 + dim)
    k_cache, v_cache = _cache(64, kv_heads, block_size, dim, gen)
    for trial in range(5):  # fresh inputs each trial: lengths 1, block edges and odd sizes
        lens = torch.tensor([1, block_size, block_size + 1, 3 * block_size - 1, 1 + trial * 7])
        width = -(-int(lens.max()) // block_size)
        table = torch.randperm(64, generator=gen)[:len(lens) * width].view(len(lens), width)
        q = torch.randn(len(lens), heads, dim, generator=gen) * dim ** -0.5
        pad = torch.arange(width * block_size) >= lens.unsqueeze(1)
        mask = torch.zeros(pad.shape).masked_fill_(pad, float("-inf"))
        gathered = [c[table.flatten()].view(len(lens), width, *c.shape[1:]) for c in (k_cache, v_cache)]
        expected = decode_attention(q, *gathered, mask)
        out = torch.ops.infragent.paged_decode_attention(q, k_cache, v_cache, table, lens)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_bf16_cache_is_written_and_read_as_torch_rounds_it():
    """A bf16 KV layer: rope_and_cache_ rounds like .to(torch.bfloat16) (nearest even, NaN kept); attention
    reads the stored values back exactly."""
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, block_size, tokens = 9, 3, 64, 16, 20
    rotary = Rotary(dim, 10000.0, 64, torch.float32)
    cos, sin = rotary.tables(torch.arange(tokens))
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    qkv[3, -1] = float("nan")  # a NaN in a stored v row stays a NaN
    blocks, offsets = torch.arange(tokens) // block_size, torch.arange(tokens) % block_size
    shape = (4, kv_heads, block_size, dim)
    k32, v32 = torch.zeros(shape), torch.zeros(shape)
    k16, v16 = torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16)
    torch.ops.infragent.rope_and_cache_(qkv.clone(), cos, sin, k32, v32, blocks, offsets, heads)
    torch.ops.infragent.rope_and_cache_(qkv, cos, sin, k16, v16, blocks, offsets, heads)
    assert torch.equal(k16.view(torch.int16), k32.to(torch.bfloat16).view(torch.int16))  # bit for bit
    assert v16[0, 2, 3, 63].isnan()  # torch's own NaN bits differ between its conversion paths
    torch.testing.assert_close(v16, v32.to(torch.bfloat16), rtol=0, atol=0, equal_nan=True)
    q = qkv[:2, :heads * dim].view(2, heads, dim).contiguous()
    table, lens = torch.tensor([[0, 1], [1, 0]]), torch.tensor([19, 7])
    v16[3, 2, 15, 0] = float("nan")  # an unused block: never read
    expected = torch.ops.infragent.paged_decode_attention(q, k16.float(), v16.float(), table, lens)
    out = torch.ops.infragent.paged_decode_attention(q, k16, v16, table, lens)
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-6, equal_nan=True)  # the NaN reaches both alike


def test_scaled_kv_write_stores_the_integers_and_scales_of_write_scaled():
    """A prefill over several blocks, decode rows that grow a block's scale, a block started afresh from
    offset 0 and an all-zero head: the native int8 write equals the torch reference bit for bit."""
    fmt = FORMATS["int8"]
    gen = torch.Generator().manual_seed(4)
    kv_heads, block_size, dim = 3, 16, 64
    native = (torch.zeros(6, kv_heads, block_size, dim, dtype=torch.int8), torch.zeros(6, kv_heads))
    reference = (native[0].clone(), native[1].clone())
    steps = [(torch.tensor([2] * 16 + [5] * 7), torch.cat([torch.arange(16), torch.arange(7)]), 1.0)]
    steps += [(torch.tensor([5]), torch.tensor([7 + i]), 1.0 + i) for i in range(6)]  # growing: re-encodes
    steps += [(torch.tensor([2, 5]), torch.tensor([0, 13]), 0.3)]  # block 2 afresh, block 5 one more row
    for blocks, offsets, size in steps:
        rows = torch.randn(len(blocks), kv_heads, dim, generator=gen) * size
        rows[:, 1] = 0.0 if size == 0.3 else rows[:, 1]  # a head of zeros: its scale stays 1 in a fresh block
        torch.ops.infragent.scaled_kv_write_(*native, blocks, offsets, rows)
        write_scaled(*reference, blocks, offsets, rows, fmt)
        assert torch.equal(native[0], reference[0]) and torch.equal(native[1], reference[1])
    assert float(native[1][2, 1]) == 1.0 and int(native[0].abs().max()) == 127


def test_int8_paged_decode_attention_applies_the_block_scales():
    fmt = FORMATS["int8"]
    gen = torch.Generator().manual_seed(5)
    heads, kv_heads, dim, block_size, num_blocks = 9, 3, 64, 16, 12
    caches = [(torch.zeros(num_blocks, kv_heads, block_size, dim, dtype=torch.int8), torch.zeros(num_blocks, kv_heads))
              for _ in range(2)]
    blocks = torch.arange(num_blocks).repeat_interleave(block_size)
    offsets = torch.arange(block_size).repeat(num_blocks)
    for data, scale in caches:  # each block its own magnitude, so a wrong scale shows
        rows = torch.randn(len(blocks), kv_heads, dim, generator=gen) * torch.rand(len(blocks), 1, 1, generator=gen) * 4
        write_scaled(data, scale, blocks, offsets, rows, fmt)
    (k8, ks), (v8, vs) = caches
    lens = torch.tensor([1, 17, 40, 3 * block_size])
    table = torch.randperm(num_blocks, generator=gen)[:12].view(4, 3)
    q = torch.randn(4, heads, dim, generator=gen) * dim ** -0.5
    out = torch.ops.infragent.paged_decode_attention(q, k8, v8, table, lens, ks, vs)
    k32, v32 = k8.float() * ks[:, :, None, None], v8.float() * vs[:, :, None, None]
    pad = torch.arange(3 * block_size) >= lens.unsqueeze(1)
    mask = torch.zeros(pad.shape).masked_fill_(pad, float("-inf"))
    gathered = [c[table.flatten()].view(4, 3, *c.shape[1:]) for c in (k32, v32)]
    torch.testing.assert_close(out, decode_attention(q, *gathered, mask), rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="needs k_scale and v_scale"):
        torch.ops.infragent.paged_decode_attention(q, k8, v8, table, lens)


def test_paged_decode_attention_reads_strided_queries_and_one_region_per_row():
    """q as a view of fused qkv rows; a contiguous-layout cache is one block (region) per sequence."""
    gen = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, max_len = 4, 2, 16, 40
    k_cache, v_cache = _cache(3, kv_heads, max_len, dim, gen)
    qkv = torch.randn(2, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv[:, :heads * dim].view(2, heads, dim)
    lens, regions = torch.tensor([40, 7]), torch.tensor([[2], [0]])
    out = torch.ops.infragent.paged_decode_attention(q, k_cache, v_cache, regions, lens)
    for row in range(2):
        k = k_cache[regions[row, 0], :, :lens[row]].repeat_interleave(2, 0)
        v = v_cache[regions[row, 0], :, :lens[row]].repeat_interleave(2, 0)
        expected = torch.softmax(q[row].unsqueeze(1) @ k.transpose(1, 2), -1) @ v
        torch.testing.assert_close(out[row], expected.squeeze(1), rtol=1e-5, atol=1e-5)


def test_rope_and_cache_matches_rotary_and_indexed_write():
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, block_size, tokens = 6, 2, 32, 4, 9
    rotary = Rotary(dim, 10000.0, 64, torch.float32)
    positions = torch.randint(0, 64, (tokens,), generator=gen)
    cos, sin = rotary.tables(positions)
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)
    blocks = torch.arange(tokens) % 8  # distinct (block, offset) slots
    offsets = torch.arange(tokens) // 8
    k_cache, v_cache = torch.zeros(8, kv_heads, block_size, dim), torch.zeros(8, kv_heads, block_size, dim)
    qk = rotary(qkv[:, :(heads + kv_heads) * dim].reshape(tokens, heads + kv_heads, dim), cos, sin)
    v = qkv[:, (heads + kv_heads) * dim:].reshape(tokens, kv_heads, dim)
    expected_k, expected_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
    expected_k[blocks, :, offsets], expected_v[blocks, :, offsets] = qk[:, heads:], v
    rotated_only = qkv.clone()  # rope_ (before an int8 cache's scaled write): the same rotation, nothing stored
    torch.ops.infragent.rope_(rotated_only, cos, sin, heads, kv_heads)
    torch.ops.infragent.rope_and_cache_(qkv, cos, sin, k_cache, v_cache, blocks, offsets, heads)
    assert torch.equal(rotated_only, qkv)
    torch.testing.assert_close(qkv[:, :heads * dim].view(tokens, heads, dim), qk[:, :heads], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(k_cache, expected_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(v_cache, expected_v)


def test_bad_tables_and_slots_raise_errors_naming_the_row():
    k_cache = v_cache = torch.zeros(4, 1, 8, 16)
    q = torch.zeros(2, 2, 16)
    with pytest.raises(RuntimeError, match="block 9 of row 1 is outside the cache"):
        torch.ops.infragent.paged_decode_attention(q, k_cache, v_cache, torch.tensor([[0], [9]]), torch.tensor([3, 3]))
    with pytest.raises(RuntimeError, match="context length 9 of row 0 does not fit"):
        torch.ops.infragent.paged_decode_attention(q, k_cache, v_cache, torch.tensor([[0], [1]]), torch.tensor([9, 3]))
    with pytest.raises(RuntimeError, match="q must be fp32"):
        torch.ops.infragent.paged_decode_attention(q.double(), k_cache, v_cache, torch.tensor([[0], [1]]),
                                                   torch.tensor([3, 3]))
    qkv = torch.zeros(1, 4 * 16)
    tables = torch.ones(1, 16)
    with pytest.raises(RuntimeError, match="slot \\(0, 8\\) of token row 0 is outside the cache"):
        torch.ops.infragent.rope_and_cache_(qkv, tables, tables, k_cache, v_cache, torch.tensor([0]),
                                            torch.tensor([8]), 2)


@pytest.mark.parametrize("tokens", [1, 3, 300])
def test_add_rms_norm_and_silu_and_mul_match_torch(tokens):
    gen = torch.Generator().manual_seed(tokens)
    hidden, delta = torch.randn(tokens, 576, generator=gen), torch.randn(tokens, 576, generator=gen)
    weight = torch.rand(576, generator=gen) + 0.5
    expected_hidden = hidden + delta
    expected = torch.nn.functional.rms_norm(expected_hidden, (576,), weight, 1e-5)
    out = torch.ops.infragent.add_rms_norm_(hidden, delta, weight, 1e-5)
    torch.testing.assert_close(hidden, expected_hidden)  # the residual add lands in place
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.ops.infragent.add_rms_norm_(hidden, None, weight, 1e-5), expected,
                               rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(tokens, 2 * 1536, generator=gen) * 8  # far into both tails of the sigmoid
    expected = torch.nn.functional.silu(gate_up[:, :1536]) * gate_up[:, 1536:]
    torch.testing.assert_close(torch.ops.infragent.silu_and_mul(gate_up), expected, rtol=1e-5, atol=1e-5)


def test_kernels_knob():
    sizes = {"head_dim": 64, "hidden_size": 576, "intermediate_size": 1536}
    assert use_native_kernels("auto", torch.float32, sizes)
    assert not use_native_kernels("auto", torch.bfloat16, sizes)  # fp32 kernels: bf16 keeps the torch path
    assert not use_native_kernels("auto", torch.float32, {**sizes, "head_dim": 24})
    assert not use_native_kernels("torch", torch.float32, sizes)
    with pytest.raises(ConfigError, match="kernels: native runs fp32 .* not head_dim 24"):
        use_native_kernels("native", torch.float32, {**sizes, "head_dim": 24})
    with pytest.raises(ConfigError, match="kernels: 'flash'"):
        from infragent.engine.config import EngineConfig
        EngineConfig(kernels="flash")


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bf16", "int8"])
def test_hybrid_engine_native_and_torch_backends_agree(kv_cache_dtype):
    """Greedy tokens agree across the two backends (batched prompts of mixed lengths, 12 decode steps)."""
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    prompts = ["The capital of France is", "a b c d e f g h i j k l m n o p q r s", "Hi"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    native = LLM(model="hybrid", kernels="native", kv_cache_dtype=kv_cache_dtype)
    torch_ops = LLM(model="hybrid", kernels="torch", kv_cache_dtype=kv_cache_dtype)
    assert native.engine.kv_cache.native(0) and not torch_ops.engine.kv_cache.native(0)
    assert [o.token_ids for o in native.generate(prompts, params)] == \
        [o.token_ids for o in torch_ops.generate(prompts, params)]


def test_a_failed_build_falls_back_under_auto_and_is_an_error_under_native(monkeypatch, caplog, tmp_path):
    """Where the kernels cannot build, auto says why once and runs torch ops; native names the knob."""
    from infragent.engine.kernels import build

    monkeypatch.setattr(build, "_loaded", False)
    monkeypatch.setattr(build, "_error", None)
    monkeypatch.setattr(build, "SOURCES", [build.HERE / "missing.cpp"])
    monkeypatch.setenv("INFRAGENT_KERNEL_CACHE", str(tmp_path))
    sizes = {"head_dim": 64, "hidden_size": 576, "intermediate_size": 1536}
    with caplog.at_level("WARNING", logger=build.__name__):
        assert not use_native_kernels("auto", torch.float32, sizes)
        assert not use_native_kernels("auto", torch.float32, sizes)
    assert len(caplog.records) == 1 and "did not build" in caplog.records[0].getMessage()
    with pytest.raises(ConfigError, match="kernels: native kernels .* did not build"):
        use_native_kernels("native", torch.float32, sizes)
