"""The KDA mixer: projections, channel-wise gate, delta-rule recurrence over per-sequence state slots."""
from __future__ import annotations

import torch

from infragent.engine.kv_cache import KDAStateCache
from functools import partial

from infragent.engine.models.kda_ops import kda_chunked, kda_decode_reference, kda_decode_step, kda_gate
from infragent.engine.models.layers import linear, rms_norm, stack
from infragent.engine.step_inputs import StepInputs
from infragent.trace import span


class KDA:
    """Kimi Delta Attention layer; decodes step the recurrence, prefill chunks run the chunked form."""

    def __init__(self, w: dict[str, torch.Tensor], num_heads: int, dk: int, dv: int, rms_eps: float,
                 chunk_size: int, state_layer: int) -> None:
        names = ("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "g_out_proj")
        self.w_in = linear(stack([w[n] for n in names]))
        self.splits = [num_heads * dk, num_heads * dk, num_heads * dv, num_heads * dk, num_heads, num_heads * dv]
        self.A_log = w["A_log"].float()
        self.dt_bias = w["dt_bias"].float().view(num_heads, dk)
        self.o_norm = w["o_norm"]
        self.o_proj = linear(w["o_proj"])
        self.h, self.dk, self.dv = num_heads, dk, dv
        self.eps = rms_eps
        self.chunk_size = chunk_size
        self.state_layer = state_layer
        self.decode_step = kda_decode_step

    def use_decode(self, impl: str, bv_tile: int | None, head_split: int) -> None:
        """Choose the decode-step implementation (vectorized with tiling knobs, or the reference loop)."""
        if impl == "reference":
            self.decode_step = kda_decode_reference
        else:
            self.decode_step = partial(kda_decode_step, bv_tile=bv_tile, head_split=head_split)

    def __call__(self, x: torch.Tensor, inputs: StepInputs, states: KDAStateCache) -> torch.Tensor:
        tokens = x.shape[0]
        h, dk, dv = self.h, self.dk, self.dv
        q, k, v, xg, b, out_gate = self.w_in(x).split(self.splits, dim=-1)
        q, k, v = q.reshape(tokens, h, dk), k.reshape(tokens, h, dk), v.reshape(tokens, h, dv)
        g = kda_gate(xg.reshape(tokens, h, dk), self.A_log, self.dt_bias)
        beta = torch.sigmoid(b.float())
        state = states.states[self.state_layer]
        out = torch.empty(tokens, h, dv, dtype=torch.float32)
        nd = inputs.num_decodes - inputs.num_verify_rows  # plain decodes: one step of the recurrence each
        if nd:
            slots = inputs.decode_state_slots
            with span("kda.state_gather", layer=self.state_layer, seqs=nd):
                step_state = state.index_select(0, slots)
            out[:nd] = self.decode_step(q[:nd], k[:nd], v[:nd], g[:nd], beta[:nd], step_state)
            with span("kda.state_scatter", layer=self.state_layer, seqs=nd):
                state.index_copy_(0, slots, step_state)
        for chunk in inputs.verifies:  # token by token, keeping what a rollback of rejected drafts needs
            rows = slice(chunk.start, chunk.start + chunk.length)
            with span("kda.verify", layer=self.state_layer, tokens=chunk.length):
                out[rows] = states.rollback.verify(self.state_layer, chunk.state_slot, q[rows], k[rows], v[rows],
                                                   g[rows], beta[rows])
        for chunk in inputs.prefills:
            rows = slice(chunk.start, chunk.start + chunk.length)
            initial = state[chunk.state_slot] if chunk.context_start else None
            out[rows], final = kda_chunked(q[rows], k[rows], v[rows], g[rows], beta[rows],
                                           initial_state=initial, chunk_size=self.chunk_size)
            state[chunk.state_slot] = final
        gated = rms_norm(out, self.o_norm.float(), self.eps) * torch.sigmoid(out_gate.float().view(tokens, h, dv))
        return self.o_proj(gated.to(x.dtype).reshape(tokens, h * dv))
