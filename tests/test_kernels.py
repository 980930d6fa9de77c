"""The native kernels (engine/kernels) against the torch-op path they replace, and their input checks."""
import pytest
import torch

from infragent.engine.kernels.build import available, use_native_attention
from infragent.engine.config import ConfigError
from infragent.engine.models.layers import Rotary, decode_attention

pytestmark = pytest.mark.skipif(not available(), reason="the native kernels do not build here")


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
    torch.ops.infragent.rope_and_cache_(qkv, cos, sin, k_cache, v_cache, blocks, offsets, heads)
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


def test_attention_backend_knob():
    assert use_native_attention("auto", torch.float32, 64)
    assert not use_native_attention("auto", torch.bfloat16, 64)  # fp32 kernels: bf16 keeps the torch path
    assert not use_native_attention("torch", torch.float32, 64)
    with pytest.raises(ConfigError, match="attention_backend: native runs fp32"):
        use_native_attention("native", torch.float32, 24)
    with pytest.raises(ConfigError, match="attention_backend: 'flash'"):
        from infragent.engine.config import EngineConfig
        EngineConfig(attention_backend="flash")


def test_hybrid_engine_native_and_torch_backends_agree():
    """Greedy tokens agree across the two backends (batched prompts of mixed lengths, 12 decode steps)."""
    from infragent.engine.llm import LLM
    from infragent.engine.sampling import SamplingParams

    prompts = ["The capital of France is", "a b c d e f g h i j k l m n o p q r s", "Hi"]
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    native = LLM(model="hybrid", attention_backend="native")
    torch_ops = LLM(model="hybrid", attention_backend="torch")
    assert native.engine.kv_cache.kernels and not torch_ops.engine.kv_cache.kernels
    assert [o.token_ids for o in native.generate(prompts, params)] == \
        [o.token_ids for o in torch_ops.generate(prompts, params)]
