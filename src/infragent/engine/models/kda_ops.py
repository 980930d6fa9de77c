"""Kimi Delta Attention (gated delta rule with per-channel decay) in pure PyTorch, fp32.

Per head, with state S [dk, dv] and token t:
    S <- Diag(exp(g_t)) S;  u = beta_t (v_t - S^T k_t);  S <- S + k_t u^T;  o_t = S^T q_t
q and k are L2-normalized (fp32) and q is scaled by dk**-0.5 unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# Tokens processed per group of chunks in kda_chunked.
_GROUP_TOKENS = 512


def kda_gate(x_g: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """Per-channel log-decay g = -exp(A_log) * softplus(x_g + dt_bias), in fp32 (always <= 0)."""
    H, dk = x_g.shape[-2], x_g.shape[-1]
    a = A_log.float().exp().reshape(H, 1)
    return -a * F.softplus(x_g.float() + dt_bias.float().reshape(H, dk))


def l2_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """L2-normalize the last dim in fp32: x / sqrt(sum(x^2) + eps)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def _prep_qk(q: Tensor, k: Tensor, scale: float | None, normalize_qk: bool) -> tuple[Tensor, Tensor]:
    """Return fp32 (q * scale, k), L2-normalized if asked."""
    if scale is None:
        scale = q.shape[-1] ** -0.5
    if normalize_qk:
        q32, k32 = l2_normalize(q), l2_normalize(k)
    else:
        q32, k32 = q.float(), k.float()
    return q32 * scale, k32


def _init_state(initial_state: Tensor | None, H: int, dk: int, dv: int, ref: Tensor) -> Tensor:
    """Fresh fp32 copy of the initial state (zeros if None)."""
    if initial_state is None:
        return torch.zeros(H, dk, dv, dtype=torch.float32, device=ref.device)
    return initial_state.to(device=ref.device, dtype=torch.float32).reshape(H, dk, dv).clone()


def kda_recurrent(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    scale: float | None = None,
    normalize_qk: bool = True,
) -> tuple[Tensor, Tensor]:
    """Token-by-token KDA over one sequence: q,k [T,H,dk], v [T,H,dv] -> (o [T,H,dv], state [H,dk,dv])."""
    steps = kda_steps(q, k, v, g, beta, initial_state, scale, normalize_qk)
    return steps.o, steps.state


@dataclass
class KDASteps:
    """A token-by-token run and what it can record for a rollback: each token's normalized key, its
    beta-scaled delta u = beta (v - S^T k), its log-decay g, and the state after each token."""

    o: Tensor  # [T,H,dv], v's dtype
    state: Tensor  # [H,dk,dv] after the last token
    k: Tensor  # [T,H,dk] fp32, normalized as used in the update
    g: Tensor  # [T,H,dk] fp32
    u: Tensor | None = None  # [T,H,dv] fp32 (record_inputs)
    states: Tensor | None = None  # [T,H,dk,dv] (record_states): the state after token t


def kda_steps(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    scale: float | None = None,
    normalize_qk: bool = True,
    record_inputs: bool = False,
    record_states: bool = False,
) -> KDASteps:
    """kda_recurrent that also records what a rollback needs (initial_state is never modified)."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    q32, k32 = _prep_qk(q, k, scale, normalize_qk)
    v32 = v.float()
    decay = g.float().exp().unsqueeze(-1)  # [T,H,dk,1]
    b32 = beta.float().reshape(T, H, 1, 1)
    S = _init_state(initial_state, H, dk, dv, k)
    q_row, k_row, k_col = q32.unsqueeze(2), k32.unsqueeze(2), k32.unsqueeze(3)
    v_row = v32.unsqueeze(2)
    o = torch.empty(T, H, 1, dv, dtype=torch.float32, device=k.device)
    us = torch.empty(T, H, 1, dv, dtype=torch.float32, device=k.device)
    states = torch.empty(T, H, dk, dv, dtype=torch.float32, device=k.device) if record_states else None
    for t in range(T):
        u = us[t]
        S.mul_(decay[t])
        torch.bmm(k_row[t], S, out=u)
        torch.sub(v_row[t], u, out=u).mul_(b32[t])
        S.baddbmm_(k_col[t], u)
        torch.bmm(q_row[t], S, out=o[t])
        if states is not None:
            states[t].copy_(S)
    return KDASteps(o.squeeze(2).to(v.dtype), S, k32, g.float(), us.squeeze(2) if record_inputs else None, states)


def kda_replay(state: Tensor, k: Tensor, u: Tensor, g: Tensor) -> Tensor:
    """The state after n recorded tokens, in closed form from the state before them (ReplaySSM):
    S_n = exp(G_n) S_0 + sum_j exp(G_n - G_j) k_j u_j^T with G_j = g_1 + ... + g_j (per key channel).
    state [H,dk,dv]; k, g [n,H,dk]; u [n,H,dv] -> [H,dk,dv] (a new tensor)."""
    if k.shape[0] == 0:
        return state.clone()
    G = g.cumsum(0)
    weighted = (G[-1] - G).exp_().mul_(k)  # exp(G_n - G_j) k_j, <= |k_j| since g <= 0
    return torch.einsum("nhk,nhv->hkv", weighted, u).addcmul_(G[-1].exp().unsqueeze(-1), state)


def _to_chunks(x: Tensor, N: int, C: int) -> Tensor:
    """fp32 copy of [T,H,...] laid out as [N,H,C,...], zero-padded at the end."""
    T = x.shape[0]
    out = torch.empty(N, x.shape[1], C, *x.shape[2:], dtype=torch.float32, device=x.device)
    tok = out.transpose(1, 2)  # [N,C,H,...] view
    full, rem = divmod(T, C)
    if full:
        tok[:full].copy_(x[: full * C].reshape(full, C, *x.shape[1:]))
    if rem:
        tok[full, :rem].copy_(x[full * C :])
        tok[full, rem:].zero_()
    return out


def _intra_scores(q: Tensor, k: Tensor, eg: Tensor) -> tuple[Tensor, Tensor]:
    """Per chunk, (Aqk, Akk)[..., t, j] = {q,k}_t . (D_tj * k_j) for j <= t, else 0; each [N,H,C,C].

    D_tj = prod_{j<i<=t} exp(g_i) = exp(G_t - G_j) is built by decaying the rows k_j one step at a
    time, so only exp(g_i) <= 1 is ever exponentiated.
    """
    N, H, C, dk = k.shape
    B = N * H
    k3, eg3 = k.view(B, C, dk), eg.view(B, C, dk)
    qk = torch.stack((q.view(B, C, dk), k3), dim=2).transpose(0, 1).contiguous()  # [C,B,2,dk]
    M = torch.zeros(B, C, dk, dtype=torch.float32, device=k.device)  # row j < t: D_tj k_j
    r = torch.empty(C, B, 2, C, dtype=torch.float32, device=k.device)
    for t in range(C):
        if t:
            M[:, :t].mul_(eg3[:, t : t + 1])
        M[:, t] = k3[:, t]
        torch.bmm(qk[t], M.transpose(1, 2), out=r[t])
    r = r.view(C, N, H, 2, C).permute(3, 1, 2, 0, 4)  # [2,N,H,C(t),C(j)]
    return r[0].contiguous(), r[1].contiguous()


def _chunk_group(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    S: Tensor,
    out: Tensor,
    C: int,
    scale: float,
    normalize_qk: bool,
) -> None:
    """Run the chunks of token slices [t,H,...] starting from state S (updated in place); write o to out."""
    t, H, dk = k.shape
    dv = v.shape[-1]
    N = -(-t // C)
    # Zero padding is inert: k = 0 and beta = 0 add nothing, g = 0 decays nothing.
    qc, kc, vc, G = (_to_chunks(x, N, C) for x in (q, k, v, g))
    bc = _to_chunks(beta, N, C).unsqueeze(-1)  # [N,H,C,1]
    if normalize_qk:
        qc.mul_(torch.rsqrt(qc.square().sum(-1, keepdim=True).add_(1e-6)).mul_(scale))
        kc.mul_(torch.rsqrt(kc.square().sum(-1, keepdim=True).add_(1e-6)))
    else:
        qc.mul_(scale)
    Aqk, Akk = _intra_scores(qc, kc, G.exp())
    G.cumsum_(2)

    # Solve (I + A) X = diag(beta) [V, K~] with A[t,j<t] = beta_t Akk[t,j] and K~ = exp(G) * k;
    # then per chunk U = U_hat - W S0 where X = [U_hat, W].
    L = Akk.mul_(bc)
    L.diagonal(dim1=-2, dim2=-1).fill_(1.0)
    eG = G.exp()
    rhs = torch.empty(N, H, C, dv + dk, dtype=torch.float32, device=k.device)
    torch.mul(vc, bc, out=rhs[..., :dv])
    torch.mul(eG, kc, out=rhs[..., dv:]).mul_(bc)
    # Solved as X^T L^T = rhs^T: this layout suits LAPACK and skips internal copies.
    X = torch.linalg.solve_triangular(
        L.transpose(-1, -2), rhs.transpose(-1, -2), upper=True, left=False, unitriangular=True
    ).transpose(-1, -2)

    # O = P U + exp(G)*q S0 = [P U_hat] + [exp(G)*q - P W] S0, with P = Aqk (diagonal included).
    PX = torch.matmul(Aqk, X)
    q_eff = eG.mul_(qc).sub_(PX[..., dv:])

    # Chunk to chunk: S1 = [exp(G_C) - Ke^T W] S0 + Ke^T U_hat, with Ke_j = exp(G_C - G_j) * k_j.
    G_end = G[:, :, -1:, :].clone()
    k_end = torch.sub(G_end, G, out=G).exp_().mul_(kc)
    KX = torch.matmul(k_end.transpose(-1, -2), X)  # [N,H,dk,dv+dk] = [Ke^T U_hat, Ke^T W]
    add, trans = KX[..., :dv], KX[..., dv:].neg_()
    trans.diagonal(dim1=-2, dim2=-1).add_(G_end.squeeze(2).exp_())

    starts = torch.empty(N + 1, H, dk, dv, dtype=torch.float32, device=k.device)
    starts[0].copy_(S)
    for n in range(N):
        torch.baddbmm(add[n], trans[n], starts[n], out=starts[n + 1])
    S.copy_(starts[N])
    O = torch.baddbmm(
        PX[..., :dv].reshape(N * H, C, dv), q_eff.reshape(N * H, C, dk), starts[:N].reshape(N * H, dk, dv)
    ).view(N, H, C, dv).transpose(1, 2)  # [N,C,H,dv]
    full, rem = divmod(t, C)
    if full:
        out[: full * C].view(full, C, H, dv).copy_(O[:full])
    if rem:
        out[full * C :].copy_(O[full, :rem])


def kda_chunked(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    scale: float | None = None,
    normalize_qk: bool = True,
    chunk_size: int = 32,
) -> tuple[Tensor, Tensor]:
    """Chunk-parallel (WY/UT) KDA over one sequence; same contract as kda_recurrent."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    C = max(1, min(chunk_size, T))
    if scale is None:
        scale = dk**-0.5
    S = _init_state(initial_state, H, dk, dv, k)
    o = torch.empty(T, H, dv, dtype=v.dtype, device=v.device)
    # Groups of chunks keep every intermediate small and cache-resident.
    step = max(1, _GROUP_TOKENS // C) * C
    for s in range(0, T, step):
        e = slice(s, s + step)
        _chunk_group(q[e], k[e], v[e], g[e], beta[e], S, o[e], C, scale, normalize_qk)
    return o, S


def kda_decode_step(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    scale: float | None = None,
    normalize_qk: bool = True,
    bv_tile: int | None = None,
    head_split: int = 1,
) -> Tensor:
    """One token for B sequences: q,k [B,H,dk], v [B,H,dv] -> o [B,H,dv]; state [B,H,dk,dv] updated in place.

    Tiling knobs (the surfaces a tuner changes): head_split runs the heads in that many groups, bv_tile runs
    the value dimension in tiles of that width. The FP32 normalization and gate are computed once per call,
    whatever the tiling; each (head group, V tile) updates its own slice of the state. The state must be
    contiguous fp32 (it is viewed, never copied).
    """
    B, H, dk = k.shape
    dv = v.shape[-1]
    if state.dtype != torch.float32 or not state.is_contiguous():
        raise ValueError("kda_decode_step needs a contiguous fp32 state")
    if H % head_split:
        raise ValueError(f"head_split: {head_split} does not divide {H} heads")
    qk = torch.stack((q, k), dim=2).float()  # [B,H,2,dk]
    if normalize_qk:
        qk.mul_(torch.linalg.vecdot(qk, qk).add_(1e-6).rsqrt_().unsqueeze_(-1))
    decay = g.float().exp().unsqueeze_(-1)  # [B,H,dk,1]
    v32, b32 = v.float(), beta.float()
    out = torch.empty(B, H, dv, dtype=torch.float32, device=v.device)
    if head_split == 1 and (bv_tile is None or bv_tile >= dv):
        _decode_tile(qk, decay, v32, b32, state, out)
    else:
        group, tile = H // head_split, bv_tile or dv
        for h0 in range(0, H, group):
            heads = slice(h0, h0 + group)
            for v0 in range(0, dv, tile):
                cols = slice(v0, min(v0 + tile, dv))
                _decode_tile(qk[:, heads], decay[:, heads], v32[:, heads, cols], b32[:, heads],
                             state[:, heads, :, cols], out[:, heads, cols])
    return out.mul_(dk**-0.5 if scale is None else scale).to(v.dtype)


def _decode_tile(qk: Tensor, decay: Tensor, v: Tensor, beta: Tensor, S: Tensor, out: Tensor) -> None:
    """The recurrence on one (head group, V tile): S [B,h,dk,w], a view of the state, is updated in place;
    out [B,h,w] receives S^T q (unscaled)."""
    B, h, dk, w = S.shape
    flat = S.reshape(B * h, dk, w)  # a view when S is contiguous, else a copy written back below
    flat.mul_(decay.reshape(B * h, dk, 1))
    k32 = qk[:, :, 1].reshape(B * h, 1, dk)
    u = torch.bmm(k32, flat)
    torch.sub(v.reshape(B * h, 1, w), u, out=u).mul_(beta.reshape(B * h, 1, 1))
    flat.baddbmm_(k32.transpose(1, 2), u)
    out.copy_(torch.bmm(qk[:, :, 0].reshape(B * h, 1, dk), flat).view(B, h, w))
    if not S.is_contiguous():
        S.copy_(flat.view(B, h, dk, w))


def kda_decode_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    state: Tensor,
    scale: float | None = None,
    normalize_qk: bool = True,
) -> Tensor:
    """kda_decode_step as a plain loop over sequences and heads (the readable reference)."""
    B, H, dk = k.shape
    scale = dk**-0.5 if scale is None else scale
    out = torch.empty(B, H, v.shape[-1], dtype=torch.float32)
    for b in range(B):
        for h in range(H):
            qv, kv = (l2_normalize(q[b, h]), l2_normalize(k[b, h])) if normalize_qk else (q[b, h].float(),
                                                                                         k[b, h].float())
            S = state[b, h] * g[b, h].float().exp().unsqueeze(-1)
            u = beta[b, h].float() * (v[b, h].float() - S.t() @ kv)
            S = S + torch.outer(kv, u)
            state[b, h] = S
            out[b, h] = S.t() @ qv * scale
    return out.to(v.dtype)


