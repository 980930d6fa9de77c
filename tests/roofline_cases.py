"""Inputs factories and planted kernel variants for the roofline tests and CLI examples."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from infragent.engine.models.kda_ops import kda_decode_step
from infragent.probes.inputs import Case

KDA_B, KDA_H, KDA_DK, KDA_DV = 4, 16, 128, 96  # dv = 96: not a multiple of a 64- or 128-wide tile
V_TILE = 128  # the padded kernels round dv up to this


def kda_shaped(B: int, H: int, dk: int, dv: int):
    """Inputs factory of one KDA decode step at these sizes (log-decay g <= 0, beta in (0, 1))."""
    def factory(trial: int, gen: torch.Generator) -> Case:
        q, k, g = (torch.randn(B, H, dk, generator=gen) for _ in range(3))
        v = torch.randn(B, H, dv, generator=gen)
        beta = torch.rand(B, H, generator=gen)
        state = torch.randn(B, H, dk, dv, generator=gen) * 0.1
        return Case(args=(q, k, v, -F.softplus(g), beta, state), label=f"B={B} H={H} dk={dk} dv={dv}")
    return factory


kda_inputs = kda_shaped(KDA_B, KDA_H, KDA_DK, KDA_DV)
kda_step = kda_decode_step  # the useful work: the unpadded kernel (its FLOP formula is registered)


def _padded(v: Tensor, state: Tensor) -> tuple[Tensor, Tensor, int]:
    dv = v.shape[-1]
    pad = -dv % V_TILE
    return F.pad(v, (0, pad)), F.pad(state, (0, pad)).contiguous(), dv


def kda_step_padded(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor) -> Tensor:
    """Planted: the decode step with dv zero-padded up to a V_TILE multiple, as a tile-aligned kernel would."""
    v_pad, s_pad, dv = _padded(v, state)
    o = kda_decode_step(q, k, v_pad, g, beta, s_pad)  # zero columns stay zero: same answer, more work
    state.copy_(s_pad[..., :dv])
    return o[..., :dv]


def kda_step_vtiled(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                    tile: int = 32) -> Tensor:
    """Planted: padded to V_TILE and run per V tile, so the q/k normalization and the gate are redone per tile."""
    v_pad, s_pad, dv = _padded(v, state)
    outs = []
    for j in range(0, v_pad.shape[-1], tile):
        s_tile = s_pad[..., j:j + tile].contiguous()
        outs.append(kda_decode_step(q, k, v_pad[..., j:j + tile], g, beta, s_tile))
        s_pad[..., j:j + tile].copy_(s_tile)
    state.copy_(s_pad[..., :dv])
    return torch.cat(outs, dim=-1)[..., :dv]


def matmul_inputs(trial: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """A [512, 512] @ [512, 512] fp32 matmul: intensity far above any CPU ridge."""
    return torch.randn(512, 512, generator=gen), torch.randn(512, 512, generator=gen)


def large_add_inputs(trial: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Two 4M-element fp32 vectors (16 MiB each): 1 FLOP per 12 bytes."""
    return torch.randn(1 << 22, generator=gen), torch.randn(1 << 22, generator=gen)


def tiny_add_inputs(trial: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """Two 4-element tensors: all fixed cost."""
    return torch.randn(4, generator=gen), torch.randn(4, generator=gen)


def large_copy_inputs(trial: int, gen: torch.Generator) -> tuple[Tensor, Tensor]:
    """dst and src of a 16 MiB fp32 copy."""
    return torch.empty(1 << 22), torch.randn(1 << 22, generator=gen)


def copy_into(dst: Tensor, src: Tensor) -> Tensor:
    """dst.copy_(src): zero FLOPs, all bytes."""
    return dst.copy_(src)


ATT_B, ATT_H, ATT_L, ATT_S, ATT_D = 1, 4, 64, 96, 64  # S = 96 keys: not a multiple of a 128-wide key tile
KEY_TILE, KEY_CHUNK = 128, 32


def attention_inputs(trial: int, gen: torch.Generator) -> Case:
    """q [B,H,L,D], k and v [B,H,S,D] of one attention call."""
    q, k, v = (torch.randn(ATT_B, ATT_H, n, ATT_D, generator=gen) for n in (ATT_L, ATT_S, ATT_S))
    return Case(args=(q, k, v), label=f"L={ATT_L} S={ATT_S} D={ATT_D}")


def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The reference: scores scaled by a divide, a fused softmax, one matmul each side."""
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def attention_padded_chunked(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Planted: keys padded 96 → 128 (masked with -inf), the softmax decomposed and run per 32-key chunk, each
    chunk recomputing the whole rows' max and sum and checking them with an .item() sync."""
    s = k.shape[-2]
    pad = -s % KEY_TILE
    k_pad, v_pad = F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
    mask = torch.zeros(s + pad)
    mask[s:] = float("-inf")
    scores = q @ k_pad.transpose(-1, -2) * (1.0 / q.shape[-1] ** 0.5) + mask
    out = torch.zeros(*q.shape[:-1], v.shape[-1])
    for j in range(0, s + pad, KEY_CHUNK):
        row_max = scores.amax(-1, keepdim=True)  # the whole row, again in every chunk
        row_sum = (scores - row_max).exp().sum(-1, keepdim=True)
        if row_sum.min().item() <= 0:  # a host sync per chunk
            raise FloatingPointError("an empty softmax row")
        p = (scores[..., j:j + KEY_CHUNK] - row_max).exp() / row_sum
        out += p @ v_pad[..., j:j + KEY_CHUNK, :]
    return out
