"""Planted candidates and input factories for the check probe's tests (and the CLI: check_cases:NAME)."""
from __future__ import annotations

from typing import Callable

import torch

from infragent.probes.check import matmul_inputs
from infragent.probes.inputs import Case


def matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The reference: x @ w."""
    return x @ w


def blocked_matmul(x: torch.Tensor, w: torch.Tensor, block: int = 128) -> torch.Tensor:
    """A correct candidate that sums K in blocks (different rounding from the reference)."""
    out = torch.zeros(x.shape[0], w.shape[1], dtype=torch.float32)
    for start in range(0, x.shape[1], block):
        out += x[:, start:start + block].float() @ w[start:start + block].float()
    return out.to(x.dtype)


def tp_inputs(trial: int, generator: torch.Generator) -> Case:
    """x[M, K] @ w[K, 1024]: N fixed so that column:4 shard 2 is always output columns 512..767."""
    m, k = [(1, 64), (17, 1023), (64, 256), (3, 2048)][trial % 4]
    x = torch.randn(m, k, generator=generator)
    w = torch.randn(k, 1024, generator=generator)
    return Case((x, w), label=f"{m}x{k}x1024", reduction=k)


def _column_shards(x: torch.Tensor, w: torch.Tensor, shards: int, shard_fn: Callable) -> torch.Tensor:
    blocks = []
    for i, (start, stop) in enumerate(_bounds(w.shape[1], shards)):
        blocks.append(shard_fn(i, start, stop))
    return torch.cat(blocks, dim=1)


def _bounds(size: int, count: int) -> list[tuple[int, int]]:
    base, extra = divmod(size, count)
    out, start = [], 0
    for i in range(count):
        stop = start + base + (i < extra)
        out.append((start, stop))
        start = stop
    return out


def tp_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A correct tensor-parallel matmul: 4 column shards computed separately, then concatenated."""
    return _column_shards(x, w, 4, lambda i, a, b: x @ w[:, a:b])


def tp_matmul_buggy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """TP matmul whose shard 2 reads the weight one column too far left (an off-by-one slice)."""
    def shard(i: int, a: int, b: int) -> torch.Tensor:
        if i == 2 and a > 0:
            return x @ w[:, a - 1:b - 1]
        return x @ w[:, a:b]
    return _column_shards(x, w, 4, shard)


def tp_matmul_scaled(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """TP matmul with an extra 1.001 scale on shard 2 only (a small, numeric-looking bug)."""
    return _column_shards(x, w, 4, lambda i, a, b: (x @ w[:, a:b]) * (1.001 if i == 2 else 1.0))


def batch_inputs(trial: int, generator: torch.Generator) -> Case:
    """x[16, K] @ w[K, N]: 16 rows, so batch:2 puts rows 8..15 in shard 1."""
    k, n = [(64, 32), (1023, 5), (256, 129), (2048, 7)][trial % 4]
    return Case((torch.randn(16, k, generator=generator), torch.randn(k, n, generator=generator)),
                label=f"16x{k}x{n}", reduction=k)


def second_tile_buggy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Rows are done in tiles of 8; the second tile starts one row early (rows 8.. get rows 7..)."""
    out = x @ w
    if x.shape[0] > 8:
        out[8:] = x[7:x.shape[0] - 1] @ w
    return out


def mutating_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Right answer, but scales its input x in place (and undoes it only in the result)."""
    x.mul_(0.5)
    return (x @ w) * 2.0


def make_caching_matmul() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A fresh candidate that memoizes its first result and returns it forever."""
    memo: list[torch.Tensor] = []

    def caching_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if not memo:
            memo.append(x @ w)
        return memo[0]
    return caching_matmul


def make_id_caching_matmul() -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A fresh candidate caching results keyed by the inputs' data_ptr (stale when refilled in place)."""
    cache: dict[tuple[int, int], torch.Tensor] = {}

    def id_caching_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        key = (x.data_ptr(), w.data_ptr())
        if key not in cache:
            cache[key] = x @ w
        return cache[key]
    return id_caching_matmul


caching_matmul = make_caching_matmul()  # for the CLI; tests make fresh ones


def constant_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Returns the right shape but ignores the values."""
    return torch.ones(x.shape[0], w.shape[1])


def nan_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x @ w with a NaN in its last element (an uninitialized tail)."""
    out = x @ w
    out.view(-1)[-1] = float("nan")
    return out


def vector_inputs(trial: int, generator: torch.Generator) -> Case:
    """A single 1-D tensor of odd length."""
    n = [7, 1000, 4097][trial % 3]
    return Case((torch.randn(n, generator=generator),), label=str(n))


def copy_of(x: torch.Tensor) -> torch.Tensor:
    """The reference copy: a new tensor."""
    return x.clone()


def lazy_copy(x: torch.Tensor) -> torch.Tensor:
    """A 'copy' that returns x itself when it is already contiguous: aliases its input."""
    return x.contiguous()


def bf16_inputs(trial: int, generator: torch.Generator) -> Case:
    """bf16 operands (the tolerance follows the dtype)."""
    case = matmul_inputs(trial, generator)
    return Case(tuple(a.to(torch.bfloat16) for a in case.args), label=case.label + " bf16", reduction=case.reduction)


def attention_inputs(trial: int, generator: torch.Generator) -> Case:
    """q, k, v of shape [B, H, S, D] with H=8 heads."""
    b, s, d = [(1, 5, 16), (2, 33, 8), (1, 64, 32)][trial % 3]
    q, k, v = (torch.randn(b, 8, s, d, generator=generator) for _ in range(3))
    return Case((q, k, v), label=f"{b}x8x{s}x{d}", reduction=s)


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Reference attention per head (no mask)."""
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def attention_head5_buggy(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Attention that forgets the 1/sqrt(d) scale on head 5."""
    out = attention(q, k, v)
    out[:, 5] = torch.softmax(q[:, 5] @ k[:, 5].transpose(-1, -2), dim=-1) @ v[:, 5]
    return out


def long_k_inputs(trial: int, generator: torch.Generator) -> Case:
    """x[M, K] @ w[K, N] with K >= 1024, so splitk:4 shards have K >= 256."""
    m, k, n = [(4, 1024, 16), (9, 2047, 5), (2, 4096, 33)][trial % 3]
    return Case((torch.randn(m, k, generator=generator), torch.randn(k, n, generator=generator)),
                label=f"{m}x{k}x{n}", reduction=k)


def short_k_buggy(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Right for K >= 1024, but its short-K fast path (K < 1024) scales the result by 1.01."""
    out = x @ w
    return out * 1.01 if x.shape[1] < 1024 else out


def relu_inplace(x: torch.Tensor) -> torch.Tensor:
    """An in-place op as both reference and candidate: mutating and aliasing are its contract."""
    return x.relu_()
