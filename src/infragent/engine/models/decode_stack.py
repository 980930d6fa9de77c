"""DecodeStack: all layers of a decode step in one native call, where the model and the step allow it.

At one row, each Python call of an op costs more than its kernel (a 576-wide RMSNorm, one query's
attention), and a layer makes about eight of them. kernels/decode_stack.cpp runs the same ops, in the same
order, on the same tensors, from C++; its outputs are bit for bit the Python path's.

The stack mirrors the Python functions in `mirrored()`. When their source is not the one last verified
against it (VERIFIED), the stack stays off and the engine logs why once: a change to the Python layer path
(a fix, or a planted slowdown) is never silently bypassed. After changing one of them, run
tests/test_decode_stack.py and set VERIFIED to what it prints.
"""
from __future__ import annotations

import functools
import hashlib
import inspect
import logging
from typing import Callable

import torch

from infragent.engine.kv_cache import KVCache
from infragent.engine.models.layers import Attention, GatedMLP, Linear
from infragent.engine.quant.blocks import BlockLinear
from infragent.engine.quant.blocks_a8 import BlockLinearA8
from infragent.engine.step_inputs import StepInputs
from infragent.trace import recording

VERIFIED = "30901d2854fa9134"  # source_digest() of the mirrored functions when tests/test_decode_stack.py passed

log = logging.getLogger(__name__)
_NONE = torch.empty(0)  # the C++ side reads an empty tensor as None
_NO_LIMIT = 1 << 62


def mirrored(decoder: type) -> list[Callable]:
    """The Python functions whose work the native stack does in their place (decoder: DecoderModel)."""
    return [decoder.run_layers, decoder.add_rms_norm, Attention.__call__, Attention._rotate_and_store,
            Attention._decode, GatedMLP.__call__, KVCache.native, KVCache.rope_and_write, KVCache.stage_transfer,
            KVCache.paged_attention, KVCache.layer_done, Linear.__call__, BlockLinear.__call__,
            BlockLinearA8.__call__]


@functools.cache
def source_digest(decoder: type) -> str:
    """A hash of the mirrored functions' source, as this checkout has it (read once a process); "unreadable"
    where the source is not installed (then the stack stays off)."""
    try:
        text = "\n".join(inspect.getsource(fn) for fn in mirrored(decoder))
    except (OSError, TypeError):
        return "unreadable"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _linear_plan(linear: object) -> tuple[list[torch.Tensor], list[int], int] | None:
    """(5 tensors, [kind, code, n, digits], rows from which it leaves the native product) of a linear the
    stack runs; None for any other (a custom gemm, a tensor-parallel or quantized wrapper)."""
    if type(linear) is Linear and linear.gemm is None:
        native_rows = torch.tensor(linear.native_rows, dtype=torch.bool) if linear.native_rows else _NONE
        rows_w = linear.weight_rows if linear.weight_rows is not None else _NONE
        return [linear.weight_t, rows_w, native_rows, _NONE, _NONE], [0, 0, 0, 0], _NO_LIMIT
    if type(linear) is BlockLinear and linear.native:
        w = linear.weight
        parts = [w.qs, *(t if t is not None else _NONE for t in (w.d, w.mins, w.row_scale)), _NONE]
        return parts, [1, linear.code, 0, 0], linear.blas_from or _NO_LIMIT
    if type(linear) is BlockLinearA8 and linear.packed is not None:
        packed, pd, pm = linear.packed
        scale = linear.row_scale if linear.row_scale is not None else _NONE
        return [packed, pd, pm, scale, _NONE], [2, linear.code, linear.shape[0], linear.digits], _NO_LIMIT
    return None


class DecodeStack:
    """The native plan of one model's layers over one KV cache, and when a step may take it."""

    def __init__(self, native: object, sites: list[tuple[object, str, object]], layers: list,
                 kv_cache: KVCache, rows_below: int) -> None:
        self.native, self.sites, self.layers, self.kv_cache = native, sites, layers, kv_cache
        self.rows_below = rows_below  # below this many rows every linear runs its native product

    def current(self, layers: list, kv_cache: KVCache) -> bool:
        """Whether the plan still holds the model's layers, linears and cache (nothing was swapped since)."""
        return (layers is self.layers and kv_cache is self.kv_cache
                and all(getattr(owner, name) is held for owner, name, held in self.sites))

    def takes(self, inputs: StepInputs) -> bool:
        """Whether this step runs here: decode rows only, no trace recording (its spans are per layer), no
        KV transfer, and few enough rows."""
        rows = len(inputs.input_ids)
        return (inputs.num_decodes == rows and not inputs.verifies and rows < self.rows_below
                and self.kv_cache.transfer is None and not recording())

    def run(self, hidden: torch.Tensor, inputs: StepInputs) -> torch.Tensor:
        """hidden after every layer (updated in place), the KV rows of this step written."""
        batch = inputs.num_decodes
        if self.kv_cache.layout == "paged":
            table = inputs.decode_blocks.view(batch, -1)
        else:
            table = inputs.decode_regions.view(batch, 1)
        return self.native.run(hidden, inputs.rope_cos, inputs.rope_sin, inputs.slot_blocks, inputs.slot_offsets,
                               table, inputs.decode_context_lens)


def build(model: object, kv_cache: KVCache) -> tuple[DecodeStack | None, str]:
    """The stack of model's layers over kv_cache, or None and the reason it does not apply."""
    if not model.kernels:
        return None, "the native fused kernels are off"
    digest = source_digest(type(model))
    if digest != VERIFIED:
        return None, (f"the Python layer path it mirrors changed (source {digest}, verified {VERIFIED}); "
                      "tests/test_decode_stack.py checks it again")  # or its source could not be read
    shape = model.shape
    tensors: list[torch.Tensor] = []
    ints: list[int] = []
    sites: list[tuple[object, str, object]] = []
    rows_below = _NO_LIMIT
    for norm_in, mixer, norm_post, mlp in model.layers:
        if type(mixer) is not Attention:
            return None, f"a {type(mixer).__name__} mixer (it runs attention layers only)"
        if type(mlp) is not GatedMLP:
            return None, f"a {type(mlp).__name__} feed-forward (it runs the dense gated MLP only)"
        layer, fmt = mixer.cache_layer, kv_cache.formats[mixer.cache_layer]
        if not kv_cache.native(layer) or (fmt is not None and fmt.scaled):
            return None, f"KV layer {layer} is stored as {fmt.name if fmt else 'the model dtype'} without its native kernel"
        tensors += [norm_in, norm_post, kv_cache.k[layer], kv_cache.v[layer]]
        for owner, name in ((mixer, "qkv"), (mixer, "o"), (mlp, "gate_up"), (mlp, "down")):
            linear = getattr(owner, name)
            plan = _linear_plan(linear)
            if plan is None:
                return None, f"a {type(linear).__name__} linear ({name})"
            tensors += plan[0]
            ints += plan[1]
            rows_below = min(rows_below, plan[2])
            sites.append((owner, name, linear))
    if not model.layers:
        return None, "no layers"
    native = torch.classes.infragent.DecodeStack(tensors, ints, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                                                 shape.rms_eps)
    return DecodeStack(native, sites, model.layers, kv_cache, rows_below), "on"
