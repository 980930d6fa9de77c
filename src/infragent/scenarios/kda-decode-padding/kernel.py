"""A KDA decode step written the way a tiled GPU kernel runs it (the brief's third case study).

The grid walks the value dimension in tiles of `v_tile` columns, so v and the state are zero-padded from
dv = 96 up to a multiple of 128, and every V tile normalizes q and k and computes the gate in FP32 again:
the same numbers once per tile. The answer is right; the work is not. The reference computes each once.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from infragent.engine.models.kda_ops import kda_decode_step
from infragent.probes.inputs import Case
from infragent.trace import span

B, H, DK, DV = 8, 16, 128, 96
PAD_TO = 128  # the kernel's V extent: dv rounded up to the widest tile


def gate(g_raw: Tensor, a_log: Tensor, dt_bias: Tensor) -> Tensor:
    """Per-channel log decay in FP32: -exp(A_log) * softplus(g_raw + dt_bias)."""
    return -a_log.float().exp() * F.softplus(g_raw.float() + dt_bias.float())


def l2_normalized(x: Tensor) -> Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, in FP32."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


def decode_step(q: Tensor, k: Tensor, v: Tensor, g_raw: Tensor, beta: Tensor, state: Tensor, a_log: Tensor,
                dt_bias: Tensor, v_tile: int = 32) -> Tensor:
    """One decode token: o [B,H,dv]; state [B,H,dk,dv] updated in place. Tiled along V as described above."""
    dv = v.shape[-1]
    pad = -dv % PAD_TO
    v_pad = F.pad(v, (0, pad))
    s_pad = F.pad(state, (0, pad)).contiguous()
    outs = []
    for start in range(0, dv + pad, v_tile):
        with span("kda.v_tile"):
            with span("kda.qk_norm"):
                qn, kn = l2_normalized(q), l2_normalized(k)
            with span("kda.gate"):
                g = gate(g_raw, a_log, dt_bias)
            with span("kda.state"):
                s_tile = s_pad[..., start:start + v_tile].contiguous()
                outs.append(kda_decode_step(qn, kn, v_pad[..., start:start + v_tile], g, beta, s_tile,
                                            normalize_qk=False))
                s_pad[..., start:start + v_tile].copy_(s_tile)
    state.copy_(s_pad[..., :dv])
    return torch.cat(outs, dim=-1)[..., :dv]


def reference(q: Tensor, k: Tensor, v: Tensor, g_raw: Tensor, beta: Tensor, state: Tensor, a_log: Tensor,
              dt_bias: Tensor) -> Tensor:
    """The same step with the gate and normalization computed once and no padding."""
    return kda_decode_step(q, k, v, gate(g_raw, a_log, dt_bias), beta, state)


def inputs(trial: int, gen: torch.Generator) -> Case:
    """One decode step for B sequences: q, k, v, raw gate, beta in (0, 1), a small FP32 state, A_log, dt_bias."""
    q, k, g_raw = (torch.randn(B, H, DK, generator=gen) for _ in range(3))
    v = torch.randn(B, H, DV, generator=gen)
    beta = torch.rand(B, H, generator=gen)
    state = torch.randn(B, H, DK, DV, generator=gen) * 0.1
    a_log = torch.randn(H, DK, generator=gen) * 0.5
    dt_bias = torch.randn(H, DK, generator=gen) * 0.1
    return Case((q, k, v, g_raw, beta, state, a_log, dt_bias), label=f"B={B} H={H} dk={DK} dv={DV}")
