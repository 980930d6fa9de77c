"""Building blocks: RMSNorm, rotary embedding, gated MLP, and attention over the KV cache."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from infragent.engine.kv_cache import KVCache
from infragent.engine.quant.blocks import BlockLinear, BlockWeight, stack_rows
from infragent.engine.step_inputs import StepInputs


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension."""
    return F.rms_norm(x, weight.shape, weight, eps)


class Rotary:
    """Rotary position embedding, NeoX (rotate-half) layout, with a precomputed cos/sin table."""

    def __init__(self, head_dim: int, theta: float, max_positions: int, dtype: torch.dtype) -> None:
        inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        self.cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(dtype)
        self.sin = torch.cat([-angles.sin(), angles.sin()], dim=-1).to(dtype)
        self.half = head_dim // 2

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, 1, head_dim] at the given positions (computed once per step)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    def __call__(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotate x [T, heads, head_dim] using the step's tables."""
        rotated = torch.cat([x[..., self.half:], x[..., :self.half]], dim=-1)
        return x * cos + rotated * sin


class Linear:
    """y = x · Wᵀ with W kept transposed ([in, out]); this BLAS runs that layout ~13% faster at decode
    batch sizes (benchmarks/linear_layout.py). Where the native dense kernel was measured faster at some row
    counts (engine/dense_choice.py), W is kept as [out, in] instead, the layout that kernel streams, and
    BLAS reads it transposed for the other row counts."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight_t = weight.t().contiguous()
        self.gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None  # None: torch.mm
        self.native_rows: tuple[bool, ...] = ()  # [m]: whether a product of m rows runs the native kernel
        self.weight_rows: torch.Tensor | None = None  # W as [out, in] for the kernel, when not weight_t.t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.gemm is not None:
            return self.gemm(x, self.weight_t)
        rows = x.shape[0]
        if rows < len(self.native_rows) and self.native_rows[rows]:
            weight = self.weight_rows if self.weight_rows is not None else self.weight_t.t()
            return torch.ops.infragent.dense_linear(x.contiguous(), weight)
        return torch.mm(x, self.weight_t)

    def use_dense_kernel(self, native_rows: tuple[bool, ...], weight: torch.Tensor | None = None) -> None:
        """Run products of m rows through the native dense kernel where native_rows[m]; weight: this W as
        [out, in], when the model already holds it so (a tied LM head's embedding), to share it. Shared, the
        kernel reads it and BLAS keeps W transposed for the row counts the kernel does not run (when there
        are any); otherwise W has the kernel's layout alone."""
        self.native_rows = native_rows
        if not any(native_rows) or not self.weight_t.is_contiguous():
            return
        held = weight if weight is not None and weight.shape == self.weight_t.t().shape else None
        if held is not None and not all(native_rows[1:]):
            self.weight_rows = held
        else:
            self.weight_t = (held if held is not None else self.weight_t.t().contiguous()).t()

    def weight_bytes(self) -> int:
        """Bytes of the stored weight."""
        return self.weight_t.nbytes


Weight = torch.Tensor | BlockWeight  # a projection's W [out, in]: a float tensor, or stored blocks


def linear(weight: Weight) -> Linear | BlockLinear:
    """The linear for W: a float W transposed for BLAS, stored blocks kept as they are (their kernels are
    switched on by DecoderModel.use_block_kernels)."""
    return BlockLinear(weight, native=False) if isinstance(weight, BlockWeight) else Linear(weight)


def stack(parts: list[Weight]) -> Weight:
    """The parts' rows, one after another (a fused projection)."""
    return stack_rows(parts) if isinstance(parts[0], BlockWeight) else torch.cat(parts, dim=0)


def scale(weight: Weight, factor: float) -> Weight:
    """W times a constant (blocks keep it as a row scale rather than rounding again)."""
    return weight.scaled(factor) if isinstance(weight, BlockWeight) else weight * factor


class GatedMLP:
    """down(silu(gate(x)) * up(x)) with gate and up fused into one matmul."""

    def __init__(self, gate: Weight, up: Weight, down: Weight) -> None:
        self.gate_up = linear(stack([gate, up]))
        self.down = linear(down)
        self.inter = gate.shape[0]

    def __call__(self, x: torch.Tensor, native: bool = False) -> torch.Tensor:
        gate_up = self.gate_up(x)
        if native:  # one fused pass (kernels/fused_layers.cpp)
            return self.down(torch.ops.infragent.silu_and_mul(gate_up))
        hidden = F.silu(gate_up[:, :self.inter]).mul_(gate_up[:, self.inter:])
        return self.down(hidden)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Single-query GQA attention of q [B, H, d] (pre-scaled) over blocked k, v [B, blocks, kv_heads, bs, d].

    Scores are computed block by block against the gathered blocks in place; the softmax runs jointly
    over all blocks; the value sum is a per-block product reduced over blocks. mask is [B, blocks * bs].
    """
    batch, heads, dim = q.shape
    _, blocks, kv_heads, block_len, _ = k.shape
    group = heads // kv_heads
    qg = q.view(batch, 1, kv_heads, group, dim)
    scores = torch.matmul(qg, k.transpose(-1, -2)).permute(0, 2, 3, 1, 4)  # [B, kv_heads, group, blocks, bs]
    scores = scores.reshape(batch, kv_heads, group, blocks * block_len)
    if mask is not None:
        scores = scores + mask[:, None, None, :]
    probs = torch.softmax(scores, dim=-1).view(batch, kv_heads, group, blocks, block_len).permute(0, 3, 1, 2, 4)
    return torch.matmul(probs, v).sum(1).reshape(batch, heads, dim)


def chunk_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context_start: int) -> torch.Tensor:
    """Causal GQA attention of n queries [n, H, d] (pre-scaled) over k, v [kv_heads, L, d] that
    hold context_start cached tokens followed by the n new ones."""
    n, heads, _ = q.shape
    kv_heads, length, _ = k.shape
    group = heads // kv_heads
    # 4-D [1, H, L, d] inputs select torch's fused CPU (flash) kernel; 3-D falls back to the math path.
    k = k.repeat_interleave(group, dim=0).unsqueeze(0)
    v = v.repeat_interleave(group, dim=0).unsqueeze(0)
    q = q.transpose(0, 1).unsqueeze(0)
    if context_start == 0:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=1.0)
    else:
        allowed = torch.arange(length) <= (context_start + torch.arange(n)).unsqueeze(1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=1.0)
    return out[0].transpose(0, 1)


class Attention:
    """GQA self-attention with RoPE that writes to and reads from its layer of the KV cache."""

    def __init__(self, q: Weight, k: Weight, v: Weight, o: Weight, num_heads: int,
                 num_kv_heads: int, head_dim: int, rotary: Rotary, cache_layer: int) -> None:
        # The softmax scale is folded into W_q (RoPE is linear, so it commutes): one multiply fewer per step.
        self.qkv = linear(stack([scale(q, head_dim ** -0.5), k, v]))
        self.o = linear(o)
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.rotary = rotary
        self.cache_layer = cache_layer

    def __call__(self, x: torch.Tensor, inputs: StepInputs, cache: KVCache) -> torch.Tensor:
        tokens = x.shape[0]
        h, d = self.num_heads, self.head_dim
        q, k, v = self._rotate_and_store(self.qkv(x), inputs, cache)
        nd = inputs.num_decodes
        if nd == tokens:
            out = self._decode(q, inputs, cache)
        else:
            out = torch.empty(tokens, h, d, dtype=q.dtype)
            if nd:
                out[:nd] = self._decode(q[:nd], inputs, cache)
            for chunk in inputs.prefills:
                rows = slice(chunk.start, chunk.start + chunk.length)
                if chunk.context_start == 0 and not cache.lossy(self.cache_layer):
                    ck, cv = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
                else:
                    ck, cv = cache.chunk_context(self.cache_layer, chunk)
                out[rows] = chunk_attention(q[rows], ck, cv, chunk.context_start)
        return self.o(out.reshape(tokens, h * d))

    def _rotate_and_store(self, qkv: torch.Tensor, inputs: StepInputs,
                          cache: KVCache) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """RoPE on the q and k heads, this step's k and v rows into the cache; q, k, v [T, heads, d]."""
        layer, h, kvh, d = self.cache_layer, self.num_heads, self.num_kv_heads, self.head_dim
        if cache.native(layer):
            return cache.rope_and_write(layer, qkv, h, inputs)
        tokens = qkv.shape[0]
        qk, v = qkv.split([(h + kvh) * d, kvh * d], dim=-1)
        qk = self.rotary(qk.reshape(tokens, h + kvh, d), inputs.rope_cos, inputs.rope_sin)  # q and k heads at once
        q, k, v = qk[:, :h], qk[:, h:], v.reshape(tokens, kvh, d)
        cache.write(layer, k, v, inputs)
        return q, k, v

    def _decode(self, q: torch.Tensor, inputs: StepInputs, cache: KVCache) -> torch.Tensor:
        """Attention of the decode rows' queries q [B, heads, d] over their cached context."""
        if cache.native(self.cache_layer):
            return cache.paged_attention(self.cache_layer, q, inputs)
        return decode_attention(q, *cache.decode_context(self.cache_layer, inputs), inputs.decode_mask)
