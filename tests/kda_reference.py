"""Naive, obviously-correct KDA reference: a per-token, per-head loop written from the math.

Independent of infragent's kda_ops on purpose; slow, used only by tests.
"""

from __future__ import annotations

import torch
from torch import Tensor


def ref_gate(x_g: Tensor, A_log: Tensor, dt_bias: Tensor) -> Tensor:
    """g[..., h, d] = -exp(A_log[h]) * log(1 + exp(x_g[..., h, d] + dt_bias[h, d]))."""
    H, dk = x_g.shape[-2:]
    a = torch.exp(A_log.double().reshape(H, 1))
    z = x_g.double() + dt_bias.double().reshape(H, dk)
    return (-a * torch.log1p(torch.exp(z))).float()


def ref_normalize(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum(x^2) + eps) over the last dim, in fp32."""
    x = x.float()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


def ref_kda(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    initial_state: Tensor | None = None,
    scale: float | None = None,
    normalize_qk: bool = True,
) -> tuple[Tensor, Tensor]:
    """Per-token, per-head loop: q,k [T,H,dk], v [T,H,dv] -> (o [T,H,dv], state [H,dk,dv]), fp32."""
    T, H, dk = k.shape
    dv = v.shape[-1]
    if scale is None:
        scale = dk**-0.5
    if normalize_qk:
        q, k = ref_normalize(q), ref_normalize(k)
    q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))
    o = torch.zeros(T, H, dv)
    states = []
    for h in range(H):
        S = torch.zeros(dk, dv) if initial_state is None else initial_state[h].float().clone()
        for t in range(T):
            S = torch.diag(torch.exp(g[t, h])) @ S
            u = beta[t, h] * (v[t, h] - S.T @ k[t, h])
            S = S + torch.outer(k[t, h], u)
            o[t, h] = S.T @ (q[t, h] * scale)
        states.append(S)
    return o, torch.stack(states)
