"""DecoderModel: embeddings, a stack of (norm, mixer, norm, MLP) layers, final norm and LM head."""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F

from infragent.engine import dense_choice
from infragent.engine.kv_cache import KDAStateCache, KVCache
from infragent.engine.models import decode_stack
from infragent.engine.models.decode_stack import DecodeStack
from infragent.engine.models.kda_layer import KDA
from infragent.engine.models.layers import Attention, GatedMLP, Linear, Rotary, Weight, linear, rms_norm
from infragent.engine.models.moe import MoE, Router
from infragent.engine.models.shape import ModelShape
from infragent.engine.quant.blocks import BlockLinear, BlockWeight
from infragent.engine.quant.blocks_a8 import A8_KINDS, BlockLinearA8
from infragent.engine.step_inputs import StepInputs
from infragent.trace import span

log = logging.getLogger(__name__)


class DecoderModel:
    """A pre-norm decoder whose mixers are attention or KDA layers, built from HF-named weights."""

    def __init__(self, shape: ModelShape, weights: dict[str, torch.Tensor], dtype: torch.dtype,
                 consume: bool = False) -> None:
        """consume: take each weight out of `weights` as it is built in, so that the loaded copy and the
        model's (transposed, fused) copy are never both whole in memory."""
        self.shape = shape

        def take(name: str) -> Weight:
            t = weights.pop(name) if consume else weights[name]
            keep = (isinstance(t, BlockWeight) or not t.is_floating_point()
                    or name.split(".")[-1] in ("A_log", "dt_bias"))
            return t if keep else t.to(dtype)

        self.embed = take("model.embed_tokens.weight")
        # Tied or not, a float LM head keeps its own transposed copy (see Linear); the embedding stays
        # row-major. Stored blocks are shared: the same blocks serve the lookup and the head.
        self.lm_head = linear(self.embed if shape.tie_word_embeddings else take("lm_head.weight"))
        self.block_kernels = False  # stored-block weights through the native kernels (use_block_kernels)
        self.final_norm = take("model.norm.weight")
        self.kernels = False  # native fused kernels for the residual add + RMSNorm and the MLP's silu * up
        self.use_decode_stack = True  # decode-only steps through one native call (models/decode_stack.py)
        self._stack: DecodeStack | None = None
        self._stack_why = ""  # the last reason logged (each new one is logged once)
        self.rotary = rotary = Rotary(shape.head_dim, shape.rope_theta, shape.max_position_embeddings, dtype)
        self.layers: list[tuple[torch.Tensor, Attention | KDA, torch.Tensor, GatedMLP | MoE]] = []
        attention_index = kda_index = 0
        for i, kind in enumerate(shape.layer_kinds):
            p = f"model.layers.{i}."
            if kind == "attention":
                mixer: Attention | KDA = Attention(
                    take(p + "self_attn.q_proj.weight"), take(p + "self_attn.k_proj.weight"),
                    take(p + "self_attn.v_proj.weight"), take(p + "self_attn.o_proj.weight"),
                    shape.num_heads, shape.num_kv_heads, shape.head_dim, rotary, attention_index)
                attention_index += 1
            else:
                kda_w = {name[len(p + "kda."):].removesuffix(".weight"): take(name)
                         for name in list(weights) if name.startswith(p + "kda.")}
                mixer = KDA(kda_w, shape.kda_num_heads, shape.kda_head_k_dim, shape.kda_head_v_dim,
                            shape.rms_eps, shape.kda_chunk_size, kda_index)
                kda_index += 1
            mlp = moe_layer(shape, p + "mlp.", take) if shape.is_moe_layer(i) else gated_mlp(p + "mlp.", take)
            self.layers.append((take(p + "input_layernorm.weight"), mixer,
                                take(p + "post_attention_layernorm.weight"), mlp))

    def projections(self) -> list[tuple[object, str]]:
        """(owner, attribute) of every layer's projection linears (not the LM head), in order."""
        sites: list[tuple[object, str]] = []
        for _, mixer, _, mlp in self.layers:
            names = ("qkv", "o") if isinstance(mixer, Attention) else ("w_in", "o_proj")
            sites += [(mixer, name) for name in names]
            for ffn in (mlp.experts + ([mlp.shared] if mlp.shared else []) if isinstance(mlp, MoE) else [mlp]):
                sites += [(ffn, "gate_up"), (ffn, "down")]
        return sites

    def linears(self) -> list[tuple[object, str]]:
        """(owner, attribute) of every linear: the projections, then the LM head."""
        return self.projections() + [(self, "lm_head")]

    def expert_load(self) -> dict[int, tuple[list[int], list[int]]]:
        """Per MoE layer index: (tokens per expert since load, tokens per expert in the last step)."""
        return {i: (mlp.tokens_per_expert.tolist(), mlp.last_step.tolist())
                for i, (_, _, _, mlp) in enumerate(self.layers) if isinstance(mlp, MoE)}

    def use_block_kernels(self, native: bool) -> None:
        """Run the stored-block weights (embedding lookup, projections, LM head) through the native kernels."""
        self._forget_stack()
        self.block_kernels = native
        for owner, name in self.linears():
            if isinstance(getattr(owner, name), (BlockLinear, BlockLinearA8)):
                getattr(owner, name).native = native

    def use_blas_from(self, rows: int | None) -> None:
        """Run every stored-block linear's products of `rows` rows or more as dequantize + BLAS (None: never)."""
        self._forget_stack()
        for owner, name in self.linears():
            block = getattr(owner, name)
            if isinstance(block, BlockLinear):
                block.blas_from = rows

    def use_int8_activations(self, digits: int) -> None:
        """Run every Q4_1/Q8_0 linear with its activations quantized per block to `digits` int8 digits
        (weight_format gguf-a8: 1, gguf-a16: 2); the embedding lookup still reads the stored blocks."""
        for owner, name in self.linears():
            block = getattr(owner, name)
            if isinstance(block, BlockLinear) and block.weight.kind in A8_KINDS:
                setattr(owner, name, BlockLinearA8(block.weight, native=block.native, digits=digits))

    def hold_fp32(self) -> None:
        """Dequantize stored-block weights in place: the model then holds what weight_format fp32 loads (a
        float embedding, and each linear's own transposed copy)."""
        self._forget_stack()
        embed = self.embed
        if isinstance(embed, BlockWeight):
            self.embed = embed.dequantize()
        for owner, name in self.linears():
            block = getattr(owner, name)
            if isinstance(block, BlockLinear):
                setattr(owner, name, linear(self.embed if block.weight is embed else block.weight.dequantize()))
        self.block_kernels = False

    def use_dense_kernel(self, threads: int) -> list[str]:
        """Run each float linear's small products through the native dense kernel at the row counts where it
        was measured faster than BLAS on this machine (dense_choice.py); returns each shape's measurement."""
        self._forget_stack()
        seen: dict[tuple[int, int], dense_choice.ShapeChoice] = {}
        for owner, name in self.linears():
            lin = getattr(owner, name)
            if not isinstance(lin, Linear) or lin.gemm is not None or lin.weight_t.dtype != torch.float32:
                continue
            in_features, out_features = lin.weight_t.shape
            if in_features % 32:  # the kernel reads rows in blocks of 32
                continue
            if (out_features, in_features) not in seen:
                seen[out_features, in_features] = dense_choice.choose(out_features, in_features, threads)
            tied = (self.embed if lin is self.lm_head and self.shape.tie_word_embeddings
                    and isinstance(self.embed, torch.Tensor) else None)
            lin.use_dense_kernel(seen[out_features, in_features].native_rows(both_layouts=tied is not None), tied)
        return [choice.describe() for choice in seen.values()]

    def use_kda_decode(self, impl: str, bv_tile: int | None, head_split: int) -> None:
        """Set every KDA layer's decode-step implementation and tiling."""
        for _, mixer, _, _ in self.layers:
            if isinstance(mixer, KDA):
                mixer.use_decode(impl, bv_tile, head_split)

    def use_gemm(self, gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None) -> None:
        """Route every layer's projections (not the LM head) through gemm (None: torch.mm)."""
        self._forget_stack()
        for owner, name in self.projections():
            getattr(owner, name).gemm = gemm

    def keep_layers(self, start: int, stop: int) -> None:
        """Keep layers [start, stop) only (a pipeline stage); their caches are renumbered from 0."""
        self._forget_stack()
        self.layers = self.layers[start:stop]
        attention = kda = 0
        for _, mixer, _, _ in self.layers:
            if isinstance(mixer, Attention):
                mixer.cache_layer, attention = attention, attention + 1
            else:
                mixer.state_layer, kda = kda, kda + 1

    def forward(self, inputs: StepInputs, kv_cache: KVCache, kda_states: KDAStateCache | None,
                num_layers: int | None = None, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Hidden states [T, hidden] of every scheduled token after all layers (or the first num_layers: a
        draft model), starting from the embeddings or from hidden (a later pipeline stage); fills the caches
        as a side effect."""
        inputs.rope_cos, inputs.rope_sin = self.rotary.tables(inputs.positions)
        # the residual stream is updated in place (add_rms_norm): a fresh tensor, never the caller's
        hidden = self.embedding(inputs.input_ids) if hidden is None else hidden.clone()
        stack = self._decode_stack(kv_cache) if num_layers is None else None
        if stack is not None and stack.takes(inputs):
            return stack.run(hidden, inputs)
        return self.run_layers(hidden, inputs, kv_cache, kda_states, self.layers[:num_layers])

    def run_layers(self, hidden: torch.Tensor, inputs: StepInputs, kv_cache: KVCache,
                   kda_states: KDAStateCache | None, layers: list) -> torch.Tensor:
        """hidden after the given layers, one op at a time (the path every step can take)."""
        delta = None  # the last sublayer's output, not yet added to the residual stream
        for layer, (norm_in, mixer, norm_post, mlp) in enumerate(layers):
            x = self.add_rms_norm(hidden, delta, norm_in)
            if isinstance(mixer, Attention):
                with span("attention", layer=layer):
                    delta = mixer(x, inputs, kv_cache)
                kv_cache.layer_done()
            else:
                with span("kda", layer=layer):
                    delta = mixer(x, inputs, kda_states)
            with span("mlp", layer=layer):
                delta = mlp(self.add_rms_norm(hidden, delta, norm_post), self.kernels)
        if delta is not None:
            hidden += delta
        return hidden

    def _decode_stack(self, kv_cache: KVCache) -> DecodeStack | None:
        """The native plan of this model's layers over kv_cache (built when first asked, again after a change),
        or None where it does not apply (asked again each step: a swapped linear may come back); each new
        reason is logged once."""
        if not (self.use_decode_stack and self.kernels and kv_cache.kernels):
            return None
        stack = self._stack
        if stack is not None and stack.current(self.layers, kv_cache):
            return stack
        stack, why = decode_stack.build(self, kv_cache)
        if why != self._stack_why:
            log.info("decode stack: %s", why)
            self._stack_why = why
        self._stack = stack
        return stack

    def _forget_stack(self) -> None:
        """The layers' linears changed in place: plan the stack again when next asked."""
        self._stack = None

    def embedding(self, ids: torch.Tensor) -> torch.Tensor:
        """The embedding rows of token ids [T] (dequantized, for stored blocks)."""
        if isinstance(self.embed, BlockWeight):
            return self.embed.dequantize(ids.contiguous(), native=self.block_kernels)
        return F.embedding(ids, self.embed)

    def add_rms_norm(self, hidden: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor) -> torch.Tensor:
        """hidden += delta in place (when given), then RMSNorm(hidden) as a new tensor."""
        if self.kernels:
            if delta is not None:
                delta = delta.contiguous()
            return torch.ops.infragent.add_rms_norm_(hidden, delta, weight, self.shape.rms_eps)
        if delta is not None:
            hidden += delta
        return rms_norm(hidden, weight, self.shape.rms_eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Next-token logits [N, vocab] (fp32) for the given hidden rows."""
        return self.lm_head(rms_norm(hidden, self.final_norm, self.shape.rms_eps)).float()

    def projection_bytes(self) -> int:
        """Bytes of every layer's projection weights as stored (with scales when quantized)."""
        return sum(getattr(owner, name).weight_bytes() for owner, name in self.projections())

    def nbytes(self) -> int:
        """Bytes of weights one decode step streams: every linear, norm and the LM head (not the embedding)."""
        norms = [self.final_norm] + [t for norm_in, _, norm_post, _ in self.layers for t in (norm_in, norm_post)]
        return self.projection_bytes() + self.lm_head.weight_bytes() + sum(t.nbytes for t in norms)


def gated_mlp(prefix: str, take: Callable[[str], Weight]) -> GatedMLP:
    """The SwiGLU MLP whose gate, up and down projections are named under prefix."""
    return GatedMLP(take(prefix + "gate_proj.weight"), take(prefix + "up_proj.weight"),
                    take(prefix + "down_proj.weight"))


def moe_layer(shape: ModelShape, prefix: str, take: Callable[[str], Weight]) -> MoE:
    """The MoE layer under prefix: router (gate), experts.{e} (this rank's, under expert parallelism), and
    shared_expert when the shape has one."""
    bias = take(prefix + "gate.e_score_correction_bias") if shape.router_skew else None
    router = Router(take(prefix + "gate.weight"), shape.num_experts_per_tok, shape.router_scoring, bias)
    first, last = shape.local_experts or (0, shape.num_experts)
    experts = [gated_mlp(f"{prefix}experts.{e}.", take) for e in range(first, last)]
    shared = gated_mlp(prefix + "shared_expert.", take) if shape.shared_expert_intermediate_size else None
    return MoE(router, experts, shared, first)
