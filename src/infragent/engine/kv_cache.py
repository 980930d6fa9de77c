"""KV cache storage for attention layers (paged or contiguous) and KDA recurrent-state storage."""
from __future__ import annotations

import math
import mmap

import torch

from infragent.engine.quant.formats import FORMATS, Format
from infragent.engine.quant.kv_quant import read_blocks, write_scaled
from infragent.engine.step_inputs import PrefillChunk, StepInputs
from infragent.trace import span


ON_DEMAND_BYTES = 1 << 20  # storage this large is committed page by page as it is written


def zeros_on_demand(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor whose memory the process holds only once written: anonymous mmap pages read as zero
    and are committed on first write, so a cache sized generously costs resident memory only for what is in
    use (torch.zeros writes, and so commits, every page up front)."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    if nbytes < ON_DEMAND_BYTES:
        return torch.zeros(shape, dtype=dtype)
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)  # the tensor keeps the map alive


class KVCache:
    """Per attention layer, K and V stored block-major as [num_blocks, kv_heads, block_size, head_dim].

    A block holds every head's keys for block_size consecutive tokens, each head's slice a contiguous
    [block_size, head_dim] matrix: decode gathers whole blocks with one row copy each, and attention
    multiplies against the gathered blocks in place, with no transposing copy. Paged layout finds a
    sequence's blocks through its block table; contiguous layout gives each sequence one block of
    max_model_len tokens (its region) and slices it.

    Each layer has its storage format (formats; None = the model's dtype): fp32 or bf16 as is, fp8 e4m3 or
    int8 with one fp32 scale per block and head (k_scale, v_scale [num_blocks, kv_heads]). Rows are encoded
    on write and decoded to the model's dtype on read, so attention always sees what the cache holds.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, layout: str, formats: list[Format | None] | None = None) -> None:
        shape = (num_blocks, num_kv_heads, block_size, head_dim)
        self.formats = [f if f is not None and f.dtype != dtype else None for f in formats or [None] * num_layers]
        self.k = [zeros_on_demand(shape, f.dtype if f else dtype) for f in self.formats]
        self.v = [zeros_on_demand(shape, f.dtype if f else dtype) for f in self.formats]
        self.k_scale = [torch.zeros(num_blocks, num_kv_heads) if f and f.scaled else None for f in self.formats]
        self.v_scale = [torch.zeros(num_blocks, num_kv_heads) if f and f.scaled else None for f in self.formats]
        self.dtype = dtype
        self.block_size = block_size
        self.layout = layout
        # Decode gathers land in reused buffers: fresh multi-MB allocations fault in new pages every layer.
        self._workspace = [torch.empty(0, dtype=dtype), torch.empty(0, dtype=dtype)]
        self.transfer = None  # a KVTransfer: each layer's prefill rows are published when the layer is done
        self.transfer_mode = "layerwise"  # or "after_prefill": every layer's rows published after the forward
        self._unsent: tuple | None = None
        self._held: list[tuple] = []  # after_prefill: layers done, not yet published
        self.kernels = False  # whether the native kernels (kernels/) run the layers they apply to (native())

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's keys and values (and scales), every layer: a fork's own copy of a shared block."""
        for store in (self.k, self.v, self.k_scale, self.v_scale):
            for layer in store:
                if layer is not None:
                    layer[dst].copy_(layer[src])

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, inputs: StepInputs) -> None:
        """Store this step's K/V rows ([T, kv_heads, head_dim]) at their (block, offset) slots."""
        with span("kv.write", layer=layer, tokens=k.shape[0]):
            self.fill(layer, k, v, inputs.slot_blocks, inputs.slot_offsets)
        self.stage_transfer(layer, k, v, inputs)

    def native(self, layer: int) -> bool:
        """Whether this layer's writes and decode attention run the native kernels (the model's dtype, bf16 or
        int8 storage; fp8 layers keep the torch path)."""
        fmt = self.formats[layer]
        return self.kernels and (fmt is None or fmt.dtype in (torch.bfloat16, torch.int8))

    def rope_and_write(self, layer: int, qkv: torch.Tensor, num_heads: int,
                       inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Native: rotate the q and k heads of qkv [T, (heads + 2 kv_heads) * d] in place and store the k, v
        rows at their slots, in one pass; return q, k, v [T, heads, d] views of qkv."""
        tokens, (kv_heads, dim) = qkv.shape[0], self.k[layer].shape[1::2]
        heads = qkv.view(tokens, num_heads + 2 * kv_heads, dim)
        q, k, v = heads.split([num_heads, kv_heads, kv_heads], dim=1)
        with span("kv.write", layer=layer, tokens=tokens):
            if self.formats[layer] is not None and self.formats[layer].scaled:  # int8: rotate, then scale and store
                torch.ops.infragent.rope_(qkv, inputs.rope_cos, inputs.rope_sin, num_heads, kv_heads)
                self.fill(layer, k, v, inputs.slot_blocks, inputs.slot_offsets)
            else:
                torch.ops.infragent.rope_and_cache_(qkv, inputs.rope_cos, inputs.rope_sin, self.k[layer],
                                                    self.v[layer], inputs.slot_blocks, inputs.slot_offsets, num_heads)
        self.stage_transfer(layer, k, v, inputs)
        return q, k, v

    def stage_transfer(self, layer: int, k: torch.Tensor, v: torch.Tensor, inputs: StepInputs) -> None:
        """With a KV transfer attached, keep this layer's prompt rows for publishing when the layer is done."""
        rows = inputs.transfer_rows
        if self.transfer is not None and rows is not None:  # the prompt's rows (copies: indexed) move to the store
            self._unsent = (layer, k[rows], v[rows], inputs.slot_blocks[rows], inputs.slot_offsets[rows])

    def fill(self, layer: int, k: torch.Tensor, v: torch.Tensor, blocks: torch.Tensor,
             offsets: torch.Tensor) -> None:
        """Store K/V rows [T, kv_heads, head_dim] at (block, offset) slots in the layer's format."""
        fmt = self.formats[layer]
        if fmt is not None and fmt.dtype == torch.int8 and self.kernels:  # write_scaled's integers, natively
            torch.ops.infragent.scaled_kv_write_(self.k[layer], self.k_scale[layer], blocks, offsets, k.float())
            torch.ops.infragent.scaled_kv_write_(self.v[layer], self.v_scale[layer], blocks, offsets, v.float())
        elif fmt is not None and fmt.scaled:
            write_scaled(self.k[layer], self.k_scale[layer], blocks, offsets, k, fmt)
            write_scaled(self.v[layer], self.v_scale[layer], blocks, offsets, v, fmt)
        else:
            self.k[layer][blocks, :, offsets] = k.to(self.k[layer].dtype)
            self.v[layer][blocks, :, offsets] = v.to(self.v[layer].dtype)

    def lossy(self, layer: int) -> bool:
        """Whether this layer stores K/V in a format other than the model's (attention must read it back)."""
        return self.formats[layer] is not None

    @property
    def any_lossy(self) -> bool:
        """Whether any layer stores K/V in a format other than the model's."""
        return any(f is not None for f in self.formats)

    def nbytes_per_token(self) -> float:
        """Bytes of K, V and scales the cache holds per token slot, all layers together."""
        total = sum(t.nbytes for t in self.k + self.v)
        total += sum(t.nbytes for t in self.k_scale + self.v_scale if t is not None)
        return total / (self.k[0].shape[0] * self.block_size) if self.k else 0.0

    def layer_done(self) -> None:
        """The attention layer finished: hand its new rows to the transfer (as vLLM's save_kv_layer does)."""
        if self._unsent is not None:
            if self.transfer_mode == "layerwise":
                self.transfer.publish(*self._unsent)
            else:
                self._held.append(self._unsent)
            self._unsent = None

    def forward_done(self) -> None:
        """after_prefill: publish every layer held back during the forward."""
        for layer in self._held:
            self.transfer.publish(*layer)
        self._held = []

    def discard_unsent(self) -> None:
        """Forget rows not yet handed to the transfer (their forward failed)."""
        self._unsent, self._held = None, []

    def decode_context(self, layer: int, inputs: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of every decode's context as blocks: [B, blocks, kv_heads, block_len, head_dim]."""
        k, v = self.k[layer], self.v[layer]
        if self.layout == "paged":
            index = inputs.decode_blocks
        else:
            length = inputs.decode_context_len
            k, v, index = k[:, :, :length], v[:, :, :length], inputs.decode_regions
        batch = inputs.num_decodes
        with span("kv.gather", layer=layer, blocks=index.numel()):
            k, v = self._gather(0, k, self.k_scale[layer], index), self._gather(1, v, self.v_scale[layer], index)
        return k.view(batch, -1, *k.shape[1:]), v.view(batch, -1, *v.shape[1:])

    def paged_attention(self, layer: int, q: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """Native: attention of the decode rows' queries q [B, heads, d] (pre-scaled) over their context,
        read in place from the cache (no gather, no padding)."""
        k, v = self.k[layer], self.v[layer]
        batch = inputs.num_decodes
        table = inputs.decode_blocks.view(batch, -1) if self.layout == "paged" else inputs.decode_regions.view(batch, 1)
        with span("paged_attention", layer=layer, blocks=table.numel()):
            return torch.ops.infragent.paged_decode_attention(q, k, v, table, inputs.decode_context_lens,
                                                              self.k_scale[layer], self.v_scale[layer])

    def _gather(self, which: int, source: torch.Tensor, scale: torch.Tensor | None,
                index: torch.Tensor) -> torch.Tensor:
        """Whole blocks, in the model's dtype, into a reused workspace buffer (decoded if stored otherwise)."""
        shape = (index.numel(), *source.shape[1:])
        numel = shape[0] * shape[1] * shape[2] * shape[3]
        if self._workspace[which].numel() < numel:
            self._workspace[which] = torch.empty(numel, dtype=self.dtype)
        out = self._workspace[which][:numel].view(shape)
        if source.dtype == self.dtype:
            return torch.index_select(source, 0, index, out=out)
        return read_blocks(source, scale, index, out)

    def chunk_context(self, layer: int, chunk: PrefillChunk) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of a prefill chunk's whole context (cached prefix plus chunk): [kv_heads, L, head_dim]."""
        length = chunk.context_start + chunk.length
        with span("kv.gather", layer=layer, tokens=length):
            return self._chunk_context(layer, chunk, length)

    def _chunk_context(self, layer: int, chunk: PrefillChunk, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.layout == "contiguous":
            return self.k[layer][chunk.region, :, :length], self.v[layer][chunk.region, :, :length]

        def tokens(cache: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
            index = chunk.context_blocks
            if cache.dtype == self.dtype:
                blocks = cache.index_select(0, index)  # [nb, kv_heads, bs, d]
            else:
                blocks = read_blocks(cache, scale, index, torch.empty((index.numel(), *cache.shape[1:]),
                                                                      dtype=self.dtype))
            return blocks.transpose(0, 1).reshape(blocks.shape[1], -1, blocks.shape[3])[:, :length]

        return tokens(self.k[layer], self.k_scale[layer]), tokens(self.v[layer], self.v_scale[layer])


def kv_formats(names: list[str]) -> list[Format | None]:
    """Formats for KV dtype names ("auto" → None, the model's dtype)."""
    return [None if name == "auto" else FORMATS[name] for name in names]



class KDAStateCache:
    """Per KDA layer, fp32 recurrent states [num_slots, heads, dk, dv]."""

    def __init__(self, num_layers: int, num_slots: int, num_heads: int, dk: int, dv: int) -> None:
        self.states = [zeros_on_demand((num_slots, num_heads, dk, dv), torch.float32) for _ in range(num_layers)]
        self.rollback = None  # speculative decoding: a SnapshotRollback or ReplayRollback over these states

    def copy_slot(self, src: int, dst: int) -> None:
        """A fork's recurrent state: the parent's, every layer."""
        for s in self.states:
            s[dst].copy_(s[src])
        if self.rollback is not None:
            self.rollback.reset([dst])

    def reset(self, slots: list[int]) -> None:
        """Zero the states of newly assigned slots."""
        if slots:
            index = torch.tensor(slots)
            for s in self.states:
                s.index_fill_(0, index, 0.0)
            if self.rollback is not None:
                self.rollback.reset(slots)
